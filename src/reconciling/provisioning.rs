//! Carries out a planned provision (`deciding::provision::Provision`): make the volume's
//! directory as planned (plain, quota, or a copy of a clone's source), then its PV; undo the
//! directory when the API server refused the PV.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, PostParams};

use crate::deciding::block;
use crate::deciding::claim::ProvisionPlan;
use crate::deciding::copy_room::NoRoomForCopy;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::path_pattern::{ADOPT_DIRECTORY, ClaimIdentity, OwnerRecord, Placing};
use crate::deciding::provision::{MakeVolume, Provision, bound_claim_uid, may_undo_directory};
use crate::deciding::volume_spec::build_pv;
use crate::error::{ClaimError, reason};
use crate::filesystem::PoolError;
use crate::filesystem::{Created, PoolRoot, VolumeDirName};
use crate::reconciling::block_volumes;
use crate::reconciling::claim_actions::object_key;
use crate::reconciling::claim_actions::{claim_key, claim_ref};
use crate::reconciling::clones;
use crate::reconciling::context::Context;
use crate::serving::metrics::Metrics;

/// Whether this call created the PV, or found it already there (only the former is timed).
#[derive(Debug, PartialEq, Eq)]
pub enum Provisioned {
    /// Created now.
    Now,
    /// Made by an earlier attempt.
    Before,
}

/// Makes the volume's directory under the name `dir` as planned, with the class's owner,
/// group and mode.
async fn make_volume(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    provision: &Provision,
    pool: &Arc<PoolRoot>,
    dir: &VolumeDirName,
) -> Result<Created, ClaimError> {
    let ownership = provision.plan.ownership;
    let mode = ownership.mode.unwrap_or(ctx.config.dir_mode);
    let created = make_directory(ctx, claim, provision, pool, dir, mode).await?;
    // A class's owner, group or mode (a clone's root too: the copy keeps its files' owners, the
    // directory gets the class's).
    if ownership.is_set() {
        pool.set_ownership(dir, ownership.uid, ownership.gid, mode)?;
    }
    Ok(created)
}

/// The directory as planned: made empty (plain or with its quota), or as a copy of a clone's
/// source or a snapshot.
async fn make_directory(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    provision: &Provision,
    pool: &Arc<PoolRoot>,
    dir: &VolumeDirName,
    mode: u32,
) -> Result<Created, ClaimError> {
    let created = match &provision.make {
        MakeVolume::Plain => pool.create_volume_dir(dir, mode)?,
        MakeVolume::BtrfsQuota { limit_bytes } => pool.create_quota_volume(dir, mode, *limit_bytes)?,
        MakeVolume::ProjectQuota { limit_bytes } => pool.create_project_volume(dir, mode, *limit_bytes)?,
        MakeVolume::Clone { source_dir, source_marked_for, source_claim, limit_bytes } => {
            let source = VolumeDirName::new(source_dir).map_err(|e| ClaimError::Pool(e.into()))?;
            if let Some(pv) = source_marked_for {
                pool.check_marked_for(&source, pv)?;
            }
            // A byte copy writes what the source holds, whatever the claim requests: as a
            // restore's, it starts only when that fits (deciding::copy_room).
            let copy_id = dir.as_str().to_owned();
            let byte_copy = !pool.shares_extents() && !pool.volume_dir_exists(dir)?;
            if byte_copy {
                let needed = pool.bytes_under(source_dir)?;
                let what = format!("the clone of claim {source_claim:?}");
                start_byte_copy(ctx, pool, pool.stats()?, (&copy_id, &provision.plan.pv_name), needed, what)
                    .map_err(|why| ClaimError::NoRoomForCopy(*why))?;
            }
            let created = clones::copy(ctx, claim, source_claim, pool, &source, dir).await;
            if byte_copy {
                ctx.copies.lock().unwrap_or_else(|e| e.into_inner()).end(&copy_id);
            }
            let created = created?;
            if let Some(limit_bytes) = limit_bytes {
                pool.set_quota_limit(dir, *limit_bytes)?;
            }
            created
        }
        MakeVolume::Restore { snapshot_dir, snapshot, limit_bytes } => {
            let source = VolumeDirName::new(snapshot_dir).map_err(|e| ClaimError::Pool(e.into()))?;
            let node = VolumeDirName::new(&ctx.me.node).map_err(|e| ClaimError::Pool(e.into()))?;
            // A byte copy writes what the snapshot holds, whatever the claim requests: it starts
            // only when that fits beside the reserve and the other copies being made.
            let copy_id = dir.as_str().to_owned();
            let byte_copy = !pool.shares_extents() && !pool.volume_dir_exists(dir)?;
            if byte_copy {
                let needed = pool.snapshot_copy_bytes(snapshot_dir)?;
                let what = format!("the restore of snapshot {snapshot:?}");
                start_byte_copy(ctx, pool, pool.stats()?, (&copy_id, &provision.plan.pv_name), needed, what)
                    .map_err(|why| ClaimError::NoRoomForCopy(*why))?;
            }
            let (copier, target) = (pool.clone(), dir.clone());
            let restored = tokio::task::spawn_blocking(move || copier.restore_snapshot(&source, &target, &node)).await;
            if byte_copy {
                ctx.copies.lock().unwrap_or_else(|e| e.into_inner()).end(&copy_id);
            }
            let report = restored.map_err(|_| PoolError::Io {
                op: "restore a snapshot",
                path: pool.volume_path(dir),
                source: rustix::io::Errno::IO,
            })??;
            tracing::info!(claim = %object_key(&claim.metadata), %snapshot, method = report.method.as_str(), bytes = report.bytes, "restored from snapshot");
            if let Some(limit_bytes) = limit_bytes {
                pool.set_quota_limit(dir, *limit_bytes)?;
            }
            report.created
        }
    };
    Ok(created)
}

/// Starts byte copy `copy_id` of `needed` bytes into volume `pv` of `pool` (whose statvfs
/// figures are `stats`) when it fits beside the reserve, the other copies in flight and, with
/// requests accounting, what is promised (its own volume's promise left out: the copy fills that
/// volume); why not when it does not.
fn start_byte_copy(
    ctx: &Context,
    pool: &PoolRoot,
    stats: crate::filesystem::PoolStats,
    (copy_id, pv): (&str, &str),
    needed: u64,
    what: String,
) -> Result<(), Box<NoRoomForCopy>> {
    let started = ctx.start_copy(copy_id, pool.path(), needed, pv, stats.available_bytes, stats.go_total_bytes);
    started.map_err(|(free_beyond_reserve, in_flight)| {
        Box::new(NoRoomForCopy {
            what,
            pool: pool.name().to_owned(),
            root: pool.path().to_owned(),
            node: ctx.me.node.clone(),
            needed,
            free_beyond_reserve,
            reserve: ctx.reserve_of(pool.path()),
            in_flight,
        })
    })
}

/// Makes the volume and its PV.
pub async fn provision(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    provision: &Provision,
    pool: &Arc<PoolRoot>,
) -> Result<Provisioned, ClaimError> {
    let plan = &provision.plan;
    let dir = VolumeDirName::new(&plan.dir_name).map_err(|e| ClaimError::Pool(e.into()))?;
    let regarding = claim_ref(claim);
    let cloning = provision.make.is_copy();
    // A plain volume is made in milliseconds, and its ProvisioningSucceeded says all a user needs:
    // one event per volume. A copy can take minutes, so a clone announces itself first. The
    // event must not delay the copy: it goes out on its own task.
    if cloning {
        let note = format!("External provisioner is provisioning volume for claim \"{}\"", claim_key(claim));
        let (events_ctx, provisioning_ref) = (ctx.clone(), regarding.clone());
        tokio::spawn(
            async move { events_ctx.normal(&provisioning_ref, reason::PROVISIONING, "Provision", note).await },
        );
    }
    let node = ctx.node_facts().await?;
    // A Block volume: its directory, its backing file on a loop, its device node (undone on
    // failure by block_volumes::make itself).
    let block_made = match plan.block {
        Some(request) => {
            // A Block clone or restore: the source's directory (or the snapshot's) is copied first
            // as any clone's (its backing file reflinked, or its data copied with its holes kept,
            // where it fits), then the copy's file is grown to the request, attached and exposed
            // as a new volume's.
            if let MakeVolume::Clone { source_dir, .. } = &provision.make {
                // A Block volume's directory is named after its PV (never by a pathPattern).
                let source = VolumeDirName::new(source_dir).map_err(|e| ClaimError::Pool(e.into()))?;
                let source_pv = ctx
                    .known_volume(source_dir)
                    .ok_or_else(|| ClaimError::Pool(PoolError::TreeChanged { path: pool.volume_path(&source) }))?;
                block_volumes::check_and_flush_source(ctx, pool, &source, &source_pv)?;
            }
            let copied = match provision.make.is_copy() {
                true => Some(make_directory(ctx, claim, provision, pool, &dir, 0o700).await?),
                false => None,
            };
            let made =
                block_volumes::make(ctx, pool, &dir, &plan.pv_name, plan.request_bytes, (request, copied.is_some()));
            let made = match (made, copied) {
                (Ok(made), copied) => block_volumes::Made { created: copied.unwrap_or(made.created), ..made },
                (Err(error), Some(Created::New)) => {
                    // Made from a copy of this attempt: the copy goes (the source stays).
                    if let Err(cleanup) = block_volumes::undo(ctx, pool, &dir, &plan.pv_name) {
                        tracing::warn!(pv = %plan.pv_name, %cleanup, "could not undo a Block clone that failed to be exposed");
                    }
                    return Err(error.into());
                }
                (Err(error), _) => return Err(error.into()),
            };
            Some(made)
        }
        None => None,
    };
    let created = match (&block_made, &provision.pattern) {
        (Some(made), _) => made.created,
        (None, None) => make_volume(ctx, claim, provision, pool, &dir).await?,
        // Made aside, owned and marked there, then renamed into place only if the place is
        // still free (filesystem::marker).
        (None, Some(Placing::Make { owner })) => {
            let making = pool.clear_making_entry(&plan.pv_name)?;
            make_volume(ctx, claim, provision, pool, &making).await?;
            pool.place_marked(&making, &dir, &plan.pv_name, &owner_record(plan, owner))?;
            Created::New
        }
        (None, Some(Placing::Reuse { record: None })) => Created::Existing,
        (None, Some(Placing::Reuse { record: Some(owner) })) => {
            pool.take_over_marked(&dir, &plan.pv_name, &plan.pv_name, &owner_record(plan, owner))?;
            Created::Existing
        }
        (None, Some(Placing::Adopt { from, owner, handed_from })) => {
            // The new claim's limit first: a volume at its old limit has no room for the new
            // marker (btrfs counts it against the subvolume's quota).
            if let Some(limit_bytes) = provision.make.limit_bytes() {
                pool.set_quota_limit(&dir, limit_bytes)?;
            }
            pool.take_over_marked(&dir, from, &plan.pv_name, &owner_record(plan, owner))?;
            let path = pool.path().join(dir.as_str());
            let handed = handed_from
                .as_deref()
                .map(|previous| format!(", handed over by Namespace annotation {ADOPT_DIRECTORY} from {previous}"));
            let handed = handed.unwrap_or_default();
            tracing::info!(claim = %claim_key(claim), pv = %plan.pv_name, %from, path = %path.display(), handed_from = handed_from.as_deref().unwrap_or("-"), "took over a pathPattern directory, data and all");
            let note = format!(
                "Reusing directory {} with its data, made for PV {from}, which is gone (pathPattern {}){handed}",
                path.display(),
                plan.path_pattern.as_deref().unwrap_or_default()
            );
            ctx.normal(&regarding, reason::DIRECTORY_REUSED, "Provision", note).await;
            Created::Existing
        }
        (None, Some(Placing::Refuse(_))) => unreachable!("the plan never provisions a refused directory"),
    };
    let capacity = Quantity(provision.capacity.clone());
    let pv = match &block_made {
        None => build_pv(plan, claim, &node, capacity),
        Some(made) => {
            let devices = ctx.config.block_device_dir.as_deref().unwrap_or(Path::new(block::DEVICE_DIR));
            match crate::deciding::volume_spec::build_block_pv(
                plan, claim, &node, capacity, made.inode, made.birth, devices,
            ) {
                Ok(pv) => pv,
                Err(refusal) => {
                    if made.created == Created::New {
                        block_volumes::undo(ctx, pool, &dir, &plan.pv_name)?;
                    }
                    return Err(refusal.into());
                }
            }
        }
    };
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let claim_uid = claim.metadata.uid.as_deref().unwrap_or_default();
    match pvs.create(&PostParams::default(), &pv).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // Made by an earlier attempt whose PV the watch cache had not shown yet: fine if it is
            // for this claim, and already counted and reported by that attempt.
            let existing = Api::<KeptVolume>::all(ctx.client.clone()).get(&plan.pv_name).await?;
            let bound_uid = bound_claim_uid(&existing);
            if bound_uid != claim_uid {
                return Err(ClaimError::PvConflict { pv: plan.pv_name.clone(), other_uid: bound_uid.to_owned() });
            }
            return Ok(Provisioned::Before);
        }
        Err(create_error) => {
            // Leave nothing behind when that is safe (deciding::provision::may_undo_directory);
            // a directory a workload already wrote to is never touched here.
            let refused_by_api = matches!(&create_error, kube::Error::Api(status) if (400..500).contains(&status.code));
            if may_undo_directory(created == Created::New, refused_by_api, plan.topology) {
                // A clone's directory holds only a copy: it goes to the trash (the source stays).
                // A Block volume's directory holds only the file made now, released first.
                let undone = if block_made.is_some() {
                    block_volumes::undo(ctx, pool, &dir, &plan.pv_name)
                } else if cloning {
                    pool.move_to_trash(&dir).map(|_| ())
                } else {
                    pool.remove_empty_volume_dir(&dir)
                };
                if let Err(cleanup) = undone {
                    return Err(ClaimError::Cleanup {
                        create: create_error.to_string(),
                        dir: pool.path().join(dir.as_str()).display().to_string(),
                        cleanup: cleanup.to_string(),
                    });
                }
            }
            return Err(create_error.into());
        }
    }
    tracing::info!(claim = %claim_key(claim), pv = %plan.pv_name, path = %pool.path().join(dir.as_str()).display(), "provisioned");
    Metrics::outcome(&ctx.metrics.provisions, "success", "none");
    ctx.forget_warnings(claim_uid);
    // Once per volume: its PV is created once (a PV found already there is Provisioned::Before).
    ctx.normal_once(
        &regarding,
        reason::PROVISIONING_SUCCEEDED,
        "Provision",
        format!("Successfully provisioned volume {}", plan.pv_name),
    )
    .await;
    Ok(Provisioned::Now)
}

/// The owner record a pattern directory of `plan` gets (`deciding::path_pattern::owner`).
fn owner_record(plan: &ProvisionPlan, owner: &ClaimIdentity) -> String {
    OwnerRecord { pv: plan.pv_name.clone(), owner: owner.clone() }.to_xattr()
}

//! The Block volumes of this node (issue #47), carried out: made and exposed when provisioned,
//! released before their directory goes to the trash, exposed again at start. Every act asks
//! `deciding::block` first (which PV, which paths) and `filesystem::block` checks each loop by
//! inode right before it acts.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use kube::api::{Api, ListParams};

use crate::deciding::block::BACKING_FILE;
use crate::deciding::block::claim::BlockRequest;
use crate::deciding::block::kept::{self, BlockVolumeRef};
use crate::deciding::block::loop_safety::{self, Volume};
use crate::deciding::kept_volume::KeptVolume;
use crate::error::{VolumeError, reason};
use crate::filesystem::block::{self, Detached, DeviceDir, LoopHost};
use crate::filesystem::{Created, PoolError, PoolRoot, VolumeDirName};
use crate::reconciling::context::Context;
use crate::serving::metrics::BlockVolumeLabel;

/// A Block volume's directory is never handed to a pod: only this process enters it.
const BLOCK_DIR_MODE: u32 = 0o700;

/// Direct I/O on the loop where the pool's filesystem allows it (else buffered).
const DIRECT_IO: bool = true;

/// The device directory of this install, `None` when Block volumes are off.
fn device_dir(ctx: &Context) -> Option<&Path> {
    ctx.config.block_device_dir.as_deref()
}

/// What [`make`] made.
pub struct Made {
    /// The volume directory was made now (undone on failure), or found from an earlier attempt.
    pub created: Created,
    /// The backing file's inode, recorded on the PV.
    pub inode: u64,
    /// Its birth time, recorded on the PV where the filesystem keeps one.
    pub birth: Option<crate::deciding::block::Birth>,
}

/// Makes the Block volume `dir` of PV `pv_name`: its directory, its backing file of `size`
/// bytes, attached and exposed as its device node. `from_copy`: the directory is a copy (a
/// clone, a restore) and must hold its backing file already. A failure after the directory was
/// made now undoes everything ([`undo`]).
pub fn make(
    ctx: &Context,
    pool: &PoolRoot,
    dir: &VolumeDirName,
    pv_name: &str,
    size: u64,
    (request, from_copy): (BlockRequest, bool),
) -> Result<Made, PoolError> {
    let devices_path = device_dir(ctx).ok_or_else(|| PoolError::BlockRefused {
        path: pool.volume_path(dir).join(BACKING_FILE),
        refusal: loop_safety::LoopRefusal::Missing,
    })?;
    // Opened first: a device directory that cannot be made fails the claim before anything is.
    let devices = DeviceDir::open(devices_path)?;
    let created = pool.create_volume_dir(dir, BLOCK_DIR_MODE)?;
    let made = (|| {
        let fd = pool.open_block_volume_dir(dir)?.ok_or(PoolError::TreeChanged { path: pool.volume_path(dir) })?;
        let dir_path = pool.volume_path(dir);
        let (_file, id) = match from_copy {
            true => block::copied_backing(fd.as_fd(), &dir_path, size, request.allocation)?,
            false => block::create_backing(fd.as_fd(), &dir_path, size, request.allocation)?,
        };
        let birth = block::backing_birth(fd.as_fd(), &dir_path)?;
        let node = VolumeDirName::new(pv_name).map_err(PoolError::from)?;
        let volume = Volume { recorded_inode: Some(id.ino) };
        let attached = block::expose(&LoopHost::host(), &devices, fd.as_fd(), &dir_path, volume, &node, DIRECT_IO)?;
        tracing::info!(pv = %pv_name, backing = %dir_path.join(BACKING_FILE).display(), loop_number = attached.facts.number, direct_io = attached.direct_io, "Block volume attached and exposed");
        ctx.metrics.block_volume_exposed(&label(pool.name(), pv_name), attached.direct_io);
        Ok((id.ino, birth))
    })();
    match made {
        Ok((inode, birth)) => Ok(Made { created, inode, birth }),
        Err(error) => {
            if created == Created::New
                && let Err(cleanup) = undo(ctx, pool, dir, pv_name)
            {
                tracing::warn!(pv = %pv_name, %cleanup, "could not undo a Block volume that failed to be made");
            }
            Err(error)
        }
    }
}

/// Undoes a Block volume this provisioning made (its PV was refused, or making it failed):
/// removes its node, detaches its loops, unlinks its backing file and removes the then empty
/// directory. Nothing else is removed: the directory must hold nothing but the backing file.
pub fn undo(ctx: &Context, pool: &PoolRoot, dir: &VolumeDirName, pv_name: &str) -> Result<(), PoolError> {
    let Some(fd) = pool.open_block_volume_dir(dir)? else { return Ok(()) };
    let dir_path = pool.volume_path(dir);
    if let Some(devices_path) = device_dir(ctx) {
        let devices = DeviceDir::open(devices_path)?;
        let node = VolumeDirName::new(pv_name).map_err(PoolError::from)?;
        // The file was made by this very attempt: no inode is recorded yet.
        block::release(&LoopHost::host(), &devices, fd.as_fd(), &dir_path, Volume { recorded_inode: None }, &node)?;
    }
    block::remove_backing(fd.as_fd(), &dir_path)?;
    ctx.metrics.block_volume_released(&label(pool.name(), pv_name));
    drop(fd);
    pool.remove_empty_volume_dir(dir)
}

/// The metrics' labels of Block volume `pv_name` in pool `pool`.
/// The pool of `pv`'s Block volume, for its metrics' label; empty for a PV refused as one.
fn pool_of(ctx: &Context, pv: &KeptVolume, devices_path: &Path) -> String {
    match kept::block_volume(pv, &ctx.config.pools, devices_path) {
        Some(Ok(found)) => found.backing_dir.pool,
        _ => String::new(),
    }
}

fn label(pool: &str, pv_name: &str) -> BlockVolumeLabel {
    BlockVolumeLabel { pool: pool.to_owned(), pv: pv_name.to_owned() }
}

/// Whether a released Block PV's directory may go to the trash now.
pub enum Release {
    /// Its node is gone and no loop holds its file.
    Done,
    /// Its device is still open; the kernel detaches it at its last close.
    Waiting,
}

/// Releases the Block volume of a PV about to be deleted: its paths checked
/// (`deciding::block::kept`), its node removed, its loops detached. Asked before the
/// directory named by the backing-dir annotation is staged for the trash.
pub async fn release_for_deletion(ctx: &Context, pv: &KeptVolume) -> Result<Release, VolumeError> {
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let Some(devices_path) = device_dir(ctx) else {
        return Err(VolumeError::BlockVolumesOff(pv_name));
    };
    let Some(found) = kept::block_volume(pv, &ctx.config.pools, devices_path) else {
        return Ok(Release::Done);
    };
    let found = found?;
    // Remembered before anything is released: a deletion failing after this exposes it again
    // once its PV is kept ([`after_release`]).
    if let Some(uid) = pv.metadata.uid.clone() {
        ctx.block_released.lock().unwrap_or_else(|e| e.into_inner()).insert(uid);
    }
    let outcome = release(ctx, &found, devices_path)?;
    match outcome {
        Detached::Now => Ok(Release::Done),
        Detached::AtLastClose => {
            let note = format!(
                "the Block device of {pv_name} is still open (a pod or a mount on this node); it is detached at its last close, and its backing file goes to the trash after that"
            );
            tracing::warn!(pv = %pv_name, "Block device still open; waiting for its last close before trashing the file");
            ctx.warn(&pv_ref(pv), reason::BLOCK_DEVICE_IN_USE, "Delete", note).await;
            Ok(Release::Waiting)
        }
    }
}

/// After a Block PV of this node is gone (deleted by hand, or after its deletion here): its
/// device node is removed and its loops detached (at their last close when still open), so that
/// no node names a volume without a PV and no loop holds its file. Its file stays: data
/// without a PV is reported, never removed (`reconciling::orphans`).
pub fn release_without_pv(ctx: &Context, pv: &KeptVolume) {
    let Some(devices_path) = device_dir(ctx) else { return };
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    match kept::block_volume(pv, &ctx.config.pools, devices_path) {
        None => {}
        Some(Err(refusal)) => {
            tracing::warn!(pv = %pv_name, %refusal, "deleted Block PV not released: its paths are refused")
        }
        Some(Ok(found)) => match release(ctx, &found, devices_path) {
            Ok(Detached::Now) => tracing::debug!(pv = %pv_name, "deleted Block PV: node and loop released"),
            Ok(Detached::AtLastClose) => {
                tracing::warn!(pv = %pv_name, "deleted Block PV: its device is still open, detached at its last close")
            }
            Err(error) => tracing::warn!(pv = %pv_name, %error, "deleted Block PV: node or loop not released"),
        },
    }
}

/// Releases `found` ([`release_loop`]); once its loop is gone or detaches at its last close,
/// the volume is no longer served here and its series go.
fn release(ctx: &Context, found: &BlockVolumeRef, devices_path: &Path) -> Result<Detached, VolumeError> {
    let released = release_loop(ctx, found, devices_path)?;
    ctx.metrics.block_volume_released(&label(&found.backing_dir.pool, &found.pv_name));
    Ok(released)
}

fn release_loop(ctx: &Context, found: &BlockVolumeRef, devices_path: &Path) -> Result<Detached, VolumeError> {
    let devices = DeviceDir::open(devices_path)?;
    let node = VolumeDirName::new(&found.pv_name).map_err(PoolError::from)?;
    let pool = ctx
        .pools
        .usable(&found.backing_dir.root)
        .ok_or_else(|| VolumeError::UnknownPool(found.backing_dir.pool.clone()))??;
    let dir = VolumeDirName::new(&found.backing_dir.dir_name).map_err(PoolError::from)?;
    let Some(fd) = pool.open_block_volume_dir(&dir)? else {
        // No directory, so no file a loop could hold: only the node may be left.
        if loop_safety::remove_node(devices.entry(&node)?)
            .map_err(|refusal| PoolError::BlockRefused { path: devices_path.join(&found.pv_name), refusal })?
        {
            devices.remove(&node)?;
        }
        return Ok(Detached::Now);
    };
    let dir_path = pool.volume_path(&dir);
    kept::check_birth(found, block::backing_birth(fd.as_fd(), &dir_path)?)?;
    Ok(block::release(&LoopHost::host(), &devices, fd.as_fd(), &dir_path, found.volume, &node)?)
}

/// A Block PV this process released for a deletion that did not go through, looked at again:
/// kept now (`Retain`, bound again), it is exposed again at once, with an event; still to be
/// deleted, it stays released for the retry (`deciding::block::released`).
pub async fn after_release(
    ctx: &Context,
    pv: &KeptVolume,
    decision: &crate::deciding::volume::VolumeDecision,
    hostname: &str,
) {
    use crate::deciding::block::released::{self, AfterRelease, ReleasedFacts};
    let Some(uid) = pv.metadata.uid.as_deref() else { return };
    let released_here = ctx.block_released.lock().unwrap_or_else(|e| e.into_inner()).contains(uid);
    let facts = ReleasedFacts {
        released_here,
        served_here: !kept::served_here(std::slice::from_ref(pv), &ctx.me, hostname).is_empty(),
        being_deleted: pv.metadata.deletion_timestamp.is_some(),
    };
    let why = match released::after_release(facts, decision) {
        AfterRelease::StayReleased => return,
        AfterRelease::Forget => {
            if released_here {
                ctx.block_released.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
            }
            return;
        }
        AfterRelease::ExposeAgain(why) => why,
    };
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let Some(devices_path) = device_dir(ctx) else { return };
    let pool = pool_of(ctx, pv, devices_path);
    let exposed =
        DeviceDir::open(devices_path).map_err(VolumeError::from).and_then(|devices| {
            match kept::block_volume(pv, &ctx.config.pools, devices_path) {
                Some(_) => expose_one(ctx, pv, &devices, devices_path),
                None => Err(VolumeError::BlockVolumesOff(pv_name.clone())),
            }
        });
    match exposed {
        Ok((number, direct_io)) => {
            ctx.block_released.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
            ctx.metrics.block_volume_exposed(&label(&pool, &pv_name), direct_io);
            let note = format!("the Block volume is exposed again ({why}); released for its deletion before");
            tracing::info!(pv = %pv_name, loop_number = number, %why, "Block volume exposed again after a failed deletion");
            ctx.normal(&pv_ref(pv), reason::BLOCK_VOLUME_EXPOSED_AGAIN, "Expose", note).await;
        }
        Err(error) => {
            ctx.metrics.block_volume_not_exposed(&label(&pool, &pv_name));
            // Kept in memory: the next look at the PV tries again.
            tracing::warn!(pv = %pv_name, %error, %why, "Block volume released for a failed deletion not exposed again; its pod waits");
            let note = format!(
                "the Block volume was released for a deletion that failed and could not be exposed again ({why}), so a pod of it waits: {error}"
            );
            ctx.warn(&pv_ref(pv), reason::BLOCK_VOLUME_NOT_EXPOSED, "Expose", note).await;
        }
    }
}

/// At start, before the controllers run (and so before the node reports ready): exposes every
/// Block PV of this node again (after a reboot nothing is attached and the host's `/dev` is
/// new), then removes the device nodes that name no Block PV served here. A volume that cannot
/// be exposed gets an event and stays without a node: its pod waits, it never gets another
/// device. Nothing is done while Block volumes are off.
pub async fn expose_at_start(ctx: &Context) {
    let Some(devices_path) = device_dir(ctx) else { return };
    let selector = crate::deciding::node_affinity::own_volumes_selector(&ctx.config.node_name, &ctx.me.affinity);
    let api: Api<KeptVolume> = Api::all(ctx.client.clone());
    let pvs = loop {
        match api.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => break list.items,
            Err(error) => {
                tracing::warn!(%error, "cannot list this node's PVs to expose its Block volumes; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    };
    let devices = match DeviceDir::open(devices_path) {
        Ok(devices) => devices,
        Err(error) => {
            tracing::error!(%error, "cannot open the Block device directory; no Block volume is exposed");
            return;
        }
    };
    let hostname = ctx.my_hostname().await;
    let served = kept::served_here(&pvs, &ctx.me, &hostname);
    for pv in &served {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let pool = pool_of(ctx, pv, devices_path);
        match expose_one(ctx, pv, &devices, devices_path) {
            Ok((number, direct_io)) => {
                tracing::info!(pv = %pv_name, loop_number = number, direct_io, "Block volume exposed at start");
                ctx.metrics.block_volume_exposed(&label(&pool, &pv_name), direct_io);
            }
            Err(error) => {
                ctx.metrics.block_volume_not_exposed(&label(&pool, &pv_name));
                tracing::warn!(pv = %pv_name, %error, "Block volume not exposed at start; its pod waits");
                let note = format!("the Block volume was not exposed at start, so a pod of it waits: {error}");
                ctx.warn(&pv_ref(pv), reason::BLOCK_VOLUME_NOT_EXPOSED, "Expose", note).await;
            }
        }
    }
    let names: Vec<&str> = served.iter().filter_map(|pv| pv.metadata.name.as_deref()).collect();
    match devices.names() {
        Ok(entries) => {
            for stale in loop_safety::stale_nodes(&entries, &names) {
                let removed = VolumeDirName::new(stale).map_err(PoolError::from).and_then(|n| devices.remove(&n));
                match removed {
                    Ok(()) => {
                        tracing::info!(node = %devices_path.join(stale).display(), "removed a device node naming no Block volume of this node")
                    }
                    Err(error) => tracing::warn!(node = stale, %error, "cannot remove a stale device node"),
                }
            }
        }
        Err(error) => tracing::warn!(%error, "cannot list the Block device directory for stale nodes"),
    }
}

/// Exposes `pv`'s volume: its loop's number and whether it does direct I/O.
fn expose_one(
    ctx: &Context,
    pv: &KeptVolume,
    devices: &DeviceDir,
    devices_path: &Path,
) -> Result<(u32, bool), VolumeError> {
    let found = kept::block_volume(pv, &ctx.config.pools, devices_path).expect("served_here keeps Block PVs only")?;
    let (fd, dir_path) = open_checked(ctx, &found)?;
    let node = VolumeDirName::new(&found.pv_name).map_err(PoolError::from)?;
    let attached = block::expose(&LoopHost::host(), devices, fd.as_fd(), &dir_path, found.volume, &node, DIRECT_IO)?;
    Ok((attached.facts.number, attached.direct_io))
}

/// The directory of the Block volume `found` opened in its pool, with its path, once its backing
/// file is the one the PV recorded (its birth time; the inode is checked at each loop action).
fn open_checked(ctx: &Context, found: &BlockVolumeRef) -> Result<(OwnedFd, PathBuf), VolumeError> {
    let pool = ctx
        .pools
        .usable(&found.backing_dir.root)
        .ok_or_else(|| VolumeError::UnknownPool(found.backing_dir.pool.clone()))??;
    let dir = VolumeDirName::new(&found.backing_dir.dir_name).map_err(PoolError::from)?;
    let dir_path = pool.volume_path(&dir);
    let fd = pool.open_block_volume_dir(&dir)?.ok_or(PoolError::BlockRefused {
        path: dir_path.join(BACKING_FILE),
        refusal: loop_safety::LoopRefusal::Missing,
    })?;
    kept::check_birth(found, block::backing_birth(fd.as_fd(), &dir_path)?)?;
    Ok((fd, dir_path))
}

/// Grows the Block volume of `pv` to `size` bytes online: its paths checked as for start-up
/// (`deciding::block::kept`, the birth time), then its backing file grown and its attached loop
/// told the new size ([`block::grow_volume`]). Returns the loop told, `None` when none is
/// attached. Refused while Block volumes are off: the device directory names the PV's node.
pub fn grow(
    ctx: &Context,
    pv: &KeptVolume,
    size: u64,
    allocation: crate::deciding::block::Allocation,
) -> Result<Option<u32>, VolumeError> {
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let devices_path = device_dir(ctx).ok_or_else(|| VolumeError::BlockVolumesOff(pv_name.clone()))?;
    let found = kept::block_volume(pv, &ctx.config.pools, devices_path)
        .ok_or_else(|| VolumeError::BlockPv(kept::BlockPvRefusal::NotLocal(pv_name)))??;
    let (fd, dir_path) = open_checked(ctx, &found)?;
    Ok(block::grow_volume(&LoopHost::host(), fd.as_fd(), &dir_path, found.volume, size, allocation)?)
}

/// Before the Block volume of PV `source` is copied (a clone, a snapshot), in its directory
/// `dir` of `pool`: its paths and backing file checked as for start-up (the recorded inode and
/// birth time: a file put in its place is never copied as the volume), then whatever a pod wrote
/// through its device and did not flush is written to the file, so that the copy holds every
/// write made before it started.
pub fn check_and_flush_source(
    ctx: &Context,
    pool: &PoolRoot,
    dir: &VolumeDirName,
    source: &KeptVolume,
) -> Result<(), VolumeError> {
    let pv_name = source.metadata.name.clone().unwrap_or_default();
    let devices_path = device_dir(ctx).ok_or_else(|| VolumeError::BlockVolumesOff(pv_name.clone()))?;
    let found = kept::block_volume(source, &ctx.config.pools, devices_path)
        .ok_or_else(|| VolumeError::BlockPv(kept::BlockPvRefusal::NotLocal(pv_name)))??;
    let dir_path = pool.volume_path(dir);
    if found.backing_dir.root != pool.path() || found.backing_dir.dir_name != dir.as_str() {
        return Err(PoolError::TreeChanged { path: dir_path }.into());
    }
    let fd = pool.open_block_volume_dir(dir)?.ok_or(PoolError::BlockRefused {
        path: dir_path.join(BACKING_FILE),
        refusal: loop_safety::LoopRefusal::Missing,
    })?;
    kept::check_birth(&found, block::backing_birth(fd.as_fd(), &dir_path)?)?;
    let flushed = block::flush_before_copy(&LoopHost::host(), fd.as_fd(), &dir_path, found.volume)?;
    tracing::debug!(source = %dir_path.display(), loops = flushed, "Block source checked and flushed before its copy");
    Ok(())
}

fn pv_ref(pv: &KeptVolume) -> k8s_openapi::api::core::v1::ObjectReference {
    use kube::Resource;
    pv.object_ref(&())
}

//! Gathers the facts the plan for a candidate claim reads (`deciding::provision::FactsNeeded`):
//! the live nodes, a clone's source, the PVs already there, and what the disk says about the
//! pool. Only what is needed is read; a pool that cannot be read is a fact too (the plan decides
//! whether it matters), and its error is kept to be reported if it does.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;

use crate::deciding::class::claim_class_name;
use crate::deciding::copy_room::VolumePromises;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout::{normalise, pv_name};
use crate::deciding::path_pattern::{self, ClaimIdentity, DirectoryFacts, Found, OwnerRecord};
use crate::deciding::pool_roots::roots_of;
use crate::deciding::provision::{ClaimFacts, FactsNeeded, PoolFacts, PoolState, RestoreFacts, RootFacts, SourceFacts};
use crate::deciding::reservations::Reservations;
use crate::deciding::snapshot::HostPathSnapshot;
use crate::deciding::static_binding::pre_bound_volume;
use crate::deciding::topology::LiveNode;
use crate::deciding::volume::{promised_bytes, volume_path};
use crate::error::ClaimError;
use crate::filesystem::{Marker, PoolError, PoolRoot, VolumeDirName};
use crate::reconciling::context::Context;

/// What was gathered for one claim.
#[derive(Default)]
pub struct Gathered {
    live: Vec<LiveNode>,
    source_name: Option<String>,
    source_claim: Option<PersistentVolumeClaim>,
    source_pv: Option<KeptVolume>,
    source_is_quota_volume: Option<bool>,
    existing_pv: Option<KeptVolume>,
    pre_bound_pv: Option<String>,
    /// What was read on each root of the claim's pool, in declared order.
    roots: Vec<RootFacts>,
    /// The open root beside each of `roots` that could be read.
    handles: Vec<Option<Arc<PoolRoot>>>,
    /// Why roots could not be read, to be reported if the plan needed them.
    errors: Vec<PoolError>,
    /// The `HostPathSnapshot` a restore names, when it exists.
    snapshot: Option<HostPathSnapshot>,
}

/// Reads what `needs` names. API errors end the reconcile (retried with backoff); disk errors
/// are kept as facts.
pub async fn gather(ctx: &Context, claim: &PersistentVolumeClaim, needs: &FactsNeeded) -> Result<Gathered, ClaimError> {
    let mut gathered = Gathered::default();
    if needs.live_nodes {
        gathered.live = ctx.live_nodes().await?;
    }
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if needs.existing_pv {
        // The watch caches answer "already provisioned?" without a round trip once synced; a PV
        // they have not seen yet is caught by AlreadyExists on create.
        let name = pv_name(uid);
        gathered.existing_pv = if ctx.health.all_synced() {
            ctx.known_volume(&name).map(|pv| (*pv).clone())
        } else {
            Api::<KeptVolume>::all(ctx.client.clone()).get_opt(&name).await?
        };
    }
    if needs.pre_bound_pvs {
        // Not the PV this node made for the claim itself (it is pre-bound to the claim too).
        let own = pv_name(uid);
        let volumes: Vec<_> = ctx
            .volumes
            .iter()
            .flat_map(|store| store.state())
            .filter(|pv| pv.metadata.name.as_deref() != Some(own.as_str()))
            .collect();
        gathered.pre_bound_pv = pre_bound_volume(claim, volumes.iter().map(|pv| pv.as_ref()));
    }
    // A name that is no object name never reaches a URL: the restore decision refuses it.
    if let Some(name) = needs.snapshot.as_ref().filter(|name| crate::deciding::layout::is_dns_subdomain(name)) {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        gathered.snapshot = Api::<HostPathSnapshot>::namespaced(ctx.client.clone(), namespace).get_opt(name).await?;
    }
    let snapshot_dir = gathered.snapshot.as_ref().and_then(|s| VolumeDirName::new(s.dir_name()?).ok());
    let asking = if needs.pattern_dir { Some(asking(ctx, claim, needs).await?) } else { None };
    if let Some(pool_name) = &needs.pool {
        // Every root of the pool (one per disk of a pool of several): the plan chooses among them.
        for pool_path in roots_of(&ctx.config.pools, pool_name) {
            let Some(usable) = ctx.pools.usable(&pool_path.root) else { continue };
            let read = match usable {
                Err(error) => Err(error),
                Ok(pool) => read_root(ctx, &pool, needs, uid, snapshot_dir.as_ref(), asking.as_ref())
                    .await?
                    .map(|facts| (facts, pool)),
            };
            let (read, handle) = match read {
                Ok((facts, pool)) => (Some(facts), Some(pool)),
                Err(error) => {
                    gathered.errors.push(error);
                    (None, None)
                }
            };
            gathered.roots.push(RootFacts { root: pool_path.root.clone(), read });
            gathered.handles.push(handle);
        }
    }
    if let Some(source_name) = &needs.clone_source {
        let (source, pv) = fetch_source(ctx, claim, source_name).await?;
        if needs.quota_facts
            && let Some(pool) = source_root(pv.as_ref()).and_then(|root| gathered.handle(&root))
        {
            gathered.source_is_quota_volume = source_dir(pv.as_ref()).map(|dir| pool.is_quota_volume(&dir));
        }
        gathered.source_name = Some(source_name.clone());
        gathered.source_claim = source;
        gathered.source_pv = pv;
    }
    Ok(gathered)
}

impl Gathered {
    /// Fills in what the claim's pool has promised (requests accounting): the capacity of the
    /// pool's volumes in the watch caches plus the volumes being made that the caches do not show
    /// yet. Call with the ledger locked and keep it locked until the plan's volume is reserved.
    pub fn count_promised(&mut self, ctx: &Context, claim_uid: &str, ledger: &Reservations, now: Instant) {
        // The watch caches hold this node's PVs and every PV no node label names (shared,
        // every-node, the Go build's): every volume of a pool this node may provision in. The
        // claim's own PV is not a promise yet.
        let own = pv_name(claim_uid);
        let volumes: Vec<_> = ctx.volumes.iter().flat_map(|store| store.state()).collect();
        // "Counted from the cache" must mean this snapshot: a PV that reached the cache after the
        // snapshot was taken would otherwise be counted neither here nor as in flight (seen: a
        // burst on a busy machine promised one volume too many).
        let snapshot: std::collections::HashSet<&str> =
            volumes.iter().filter_map(|pv| pv.metadata.name.as_deref()).collect();
        // Byte copies of snapshots kept on a root take room no volume's request counts, and so
        // will the copies in flight (deciding::copy_room).
        let copies = ctx.copies.lock().unwrap_or_else(|e| e.into_inner());
        for root in &mut self.roots {
            let Some(facts) = &mut root.read else { continue };
            let others =
                volumes.iter().map(|pv| pv.as_ref()).filter(|pv| pv.metadata.name.as_deref() != Some(own.as_str()));
            let cached = promised_bytes(others, &root.root);
            let in_flight = ledger.outstanding(&root.root.to_string_lossy(), &own, |name| snapshot.contains(name), now);
            let volumes = VolumePromises { cached, being_made: in_flight };
            facts.promised_bytes = Some(copies.promised_for_volume(&root.root, volumes));
            facts.available_bytes = copies.available_for_volume(&root.root, facts.available_bytes);
        }
    }

    /// Sets what the claim's pool has promised, counted elsewhere (a shared pool's record).
    pub fn set_promised(&mut self, bytes: u64) {
        for facts in self.roots.iter_mut().filter_map(|root| root.read.as_mut()) {
            facts.promised_bytes = Some(bytes);
        }
    }

    /// The pool's name and root, as nodes advertise it, when the pool could be read.
    pub fn pool_key(&self) -> Option<crate::deciding::topology::PoolKey> {
        let pool = self.handles.iter().flatten().next()?;
        Some(crate::deciding::topology::PoolKey::new(pool.name(), &pool.path().to_string_lossy()))
    }

    /// The facts, as the plan reads them.
    pub fn facts<'a>(
        &'a self,
        claim: &'a PersistentVolumeClaim,
        class: Option<&'a StorageClass>,
        ctx: &'a Context,
    ) -> ClaimFacts<'a> {
        let needs_restore = crate::deciding::snapshot::requested_snapshot(claim);
        let pool = if self.roots.iter().any(|root| root.read.is_some()) {
            PoolState::Ready(&self.roots)
        } else if self.roots.is_empty() {
            PoolState::Missing
        } else {
            PoolState::Unusable
        };
        ClaimFacts {
            claim,
            class,
            me: &ctx.me,
            config: &ctx.decision,
            live: &self.live,
            source: self.source_name.as_deref().map(|name| SourceFacts {
                name,
                claim: self.source_claim.as_ref(),
                pv: self.source_pv.as_ref(),
                is_quota_volume: self.source_is_quota_volume,
            }),
            existing_pv: self.existing_pv.as_ref(),
            pre_bound_pv: self.pre_bound_pv.as_deref(),
            pool,
            restore: needs_restore.map(|name| RestoreFacts { name, snapshot: self.snapshot.as_ref() }),
        }
    }

    /// The open pool root at `root`, for carrying out a provision there.
    pub fn handle(&self, root: &std::path::Path) -> Option<Arc<PoolRoot>> {
        let index = self.roots.iter().position(|r| r.root == root)?;
        self.handles.get(index)?.clone()
    }

    /// The error a root of the pool was read with (the first), for reporting it.
    pub fn take_pool_error(&mut self) -> Option<PoolError> {
        (!self.errors.is_empty()).then(|| self.errors.swap_remove(0))
    }
}

/// What one root of the claim's pool says: space, the claim's directory, quota and, for a
/// `pathPattern` class, what is at the claim's directory. A disk error is a fact of that root.
async fn read_root(
    ctx: &Context,
    pool: &PoolRoot,
    needs: &FactsNeeded,
    uid: &str,
    snapshot: Option<&VolumeDirName>,
    asking: Option<&Asking>,
) -> Result<Result<PoolFacts, PoolError>, ClaimError> {
    // What the pool has promised is read later, under the planning lock (`count_promised`),
    // so that it and the volumes being made are one snapshot.
    let mut facts = match read_pool(pool, needs) {
        Ok(facts) => facts,
        Err(error) => return Ok(Err(error)),
    };
    if let Some(snapshot) = snapshot {
        match pool.has_snapshot(snapshot) {
            Ok(here) => facts.snapshot_here = here,
            Err(error) => return Ok(Err(error)),
        }
        if facts.snapshot_here {
            match pool.snapshot_is_subvolume(snapshot) {
                Ok(subvolume) => facts.snapshot_subvolume = subvolume,
                Err(error) => return Ok(Err(error)),
            }
        }
    }
    if let Some(asking) = asking
        && let Some(Ok(dir)) = needs.dir_name.as_deref().map(VolumeDirName::new)
    {
        // A name that is no directory name is refused by the plan first.
        match pattern_facts(ctx, pool, &dir, &pv_name(uid), asking).await? {
            Ok(pattern) => facts.pattern = Some(pattern),
            Err(error) => return Ok(Err(error)),
        }
    }
    Ok(Ok(facts))
}

fn read_pool(pool: &PoolRoot, needs: &FactsNeeded) -> Result<PoolFacts, PoolError> {
    let stats = pool.stats()?;
    let dir_exists = match needs.dir_name.as_deref().map(VolumeDirName::new) {
        Some(Ok(dir)) => pool.volume_dir_exists(&dir)?,
        _ => false,
    };
    let quota = if needs.quota_facts { Some(pool.quota_facts()?) } else { None };
    Ok(PoolFacts {
        available_bytes: stats.available_bytes,
        total_bytes: stats.go_total_bytes,
        dir_exists,
        quota,
        promised_bytes: None,
        pattern: None,
        snapshot_here: false,
        snapshot_subvolume: false,
    })
}

/// Who asks for a `pathPattern` directory, and whether the claim's Namespace hands the
/// directory over (`path_pattern::ADOPT_DIRECTORY`).
pub struct Asking {
    identity: ClaimIdentity,
    handed_over: bool,
}

/// Reads the claim's Namespace (one get of its metadata, only for a `pathPattern` claim about
/// to be provisioned): its UID tells a namespace made again under the same name from the one a
/// directory was made for. Asked of the API server, not a cache: handing data over on a view
/// that is behind is not an option.
async fn asking(ctx: &Context, claim: &PersistentVolumeClaim, needs: &FactsNeeded) -> Result<Asking, ClaimError> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let meta = Api::<Namespace>::all(ctx.client.clone()).get_metadata(namespace).await?.metadata;
    let handed_over = path_pattern::handed_over(
        crate::keys::annotation(&meta, path_pattern::ADOPT_DIRECTORY),
        needs.dir_name.as_deref().unwrap_or_default(),
    );
    let identity = ClaimIdentity {
        namespace_uid: meta.uid.unwrap_or_default(),
        namespace: namespace.to_owned(),
        claim: claim.metadata.name.clone().unwrap_or_default(),
        class: claim_class_name(claim).unwrap_or_default().to_owned(),
    };
    Ok(Asking { identity, handed_over })
}

/// What is at a `pathPattern` directory: its marker and owner record (a disk error is a pool
/// fact), whether the PV the marker names exists (asked of the API server: taking data over on
/// a cache that is behind is not an option), and which other PV of the caches names the
/// directory as its path.
async fn pattern_facts(
    ctx: &Context,
    pool: &PoolRoot,
    dir: &VolumeDirName,
    own_pv: &str,
    asking: &Asking,
) -> Result<Result<DirectoryFacts, PoolError>, ClaimError> {
    let found = match pool.volume_marker(dir) {
        Ok(Marker::Absent) => Found::Absent,
        Ok(Marker::Unmarked) => Found::Unmarked,
        Ok(Marker::MarkedFor(pv)) => Found::MarkedFor(pv),
        Err(error) => return Ok(Err(error)),
    };
    let recorded = match &found {
        Found::MarkedFor(_) => match pool.volume_owner_record(dir) {
            Ok(record) => record.as_deref().and_then(OwnerRecord::parse),
            Err(error) => return Ok(Err(error)),
        },
        Found::Absent | Found::Unmarked => None,
    };
    let marked_pv_exists = match &found {
        Found::MarkedFor(pv) if pv != own_pv => Api::<KeptVolume>::all(ctx.client.clone()).get_opt(pv).await?.is_some(),
        _ => false,
    };
    let path = pool.path().join(dir.as_str());
    let held_by = ctx.volumes.iter().flat_map(|store| store.state()).find_map(|pv| {
        let name = pv.metadata.name.as_deref()?;
        let names_path = volume_path(&pv).and_then(|p| normalise(p).ok()).is_some_and(|p| p == path);
        (name != own_pv && names_path).then(|| name.to_owned())
    });
    Ok(Ok(DirectoryFacts {
        found,
        marked_pv_exists,
        held_by,
        recorded,
        asker: asking.identity.clone(),
        handed_over: asking.handed_over,
    }))
}

/// The directory holding a source PV's volume: the pool root it would be on.
fn source_root(pv: Option<&KeptVolume>) -> Option<std::path::PathBuf> {
    let path = normalise(volume_path(pv?)?).ok()?;
    path.parent().map(std::path::Path::to_path_buf)
}

/// The directory a source PV names, as a name under a pool root (the plan checks that it is one
/// of the clone's pool; this only says which directory to ask the disk about).
fn source_dir(pv: Option<&KeptVolume>) -> Option<VolumeDirName> {
    let path = crate::deciding::volume::volume_path(pv?)?;
    let name = std::path::Path::new(path).file_name()?.to_str()?;
    VolumeDirName::new(name).ok()
}

/// The source claim and the PV it is bound to, when they exist.
async fn fetch_source(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source_name: &str,
) -> Result<(Option<PersistentVolumeClaim>, Option<KeptVolume>), kube::Error> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let source = claims.get_opt(source_name).await?;
    let pv_name =
        source.as_ref().and_then(|s| s.spec.as_ref()).and_then(|s| s.volume_name.clone()).filter(|n| !n.is_empty());
    let pv = match pv_name {
        None => None,
        Some(name) => match ctx.known_volume(&name) {
            Some(pv) => Some((*pv).clone()),
            None => Api::<KeptVolume>::all(ctx.client.clone()).get_opt(&name).await?,
        },
    };
    Ok((source, pv))
}

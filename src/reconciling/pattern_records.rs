//! At start, gives the `pathPattern` directories of this node made before owner records existed
//! their record (`deciding::path_pattern::record_for_earlier_directory`), while their PVs still
//! say whose they are: after an upgrade, a claim deleted under Retain and made again gets its
//! data back as it did before, without an admin. A directory whose PV is already gone, or whose
//! namespace was made again since, is left to the admin's annotation (docs/volumes.md).

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume};
use kube::Api;

use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout;
use crate::deciding::path_pattern::{EarlierDirectory, OwnerRecord, record_for_earlier_directory};
use crate::deciding::volume::{owner_node, volume_path};
use crate::filesystem::{Marker, VolumeDirName};
use crate::keys;
use crate::reconciling::context::Context;

/// Records the earlier directories of this node's pattern PVs; what fails is said in the log and
/// tried again at the next start (nothing depends on it but a later take-over).
pub async fn record_earlier_directories(ctx: &Context) {
    let pvs: Vec<std::sync::Arc<KeptVolume>> = ctx
        .volumes
        .iter()
        .flat_map(|store| store.state())
        .filter(|pv| pv.annotations.contains_key(keys::PATH_PATTERN))
        .filter(|pv| pv.annotations.get(keys::PROVISIONED_BY).is_some_and(|p| ctx.me.serves(p)))
        .filter(|pv| owner_node(pv) == Some(ctx.me.node.as_str()))
        .collect();
    for pv in pvs {
        if let Err(why) = record(ctx, &pv).await {
            let name = pv.metadata.name.as_deref().unwrap_or_default();
            tracing::warn!(pv = name, %why, "cannot give the pathPattern directory of an earlier version its owner record; tried again at the next start");
        }
    }
}

async fn record(ctx: &Context, pv: &KeptVolume) -> Result<(), String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let Some(path) = volume_path(pv) else { return Ok(()) };
    let Ok(accepted) = layout::accept_volume_path(path, name, &ctx.config.pools, true) else { return Ok(()) };
    let Some(pool) = ctx.pools.usable(&accepted.root) else { return Ok(()) };
    let pool = pool.map_err(|e| e.to_string())?;
    let dir = VolumeDirName::new(&accepted.dir_name).map_err(|e| e.to_string())?;
    let marker = match pool.volume_marker(&dir).map_err(|e| e.to_string())? {
        Marker::MarkedFor(pv) => pv,
        Marker::Absent | Marker::Unmarked => return Ok(()),
    };
    let record = pool.volume_owner_record(&dir).map_err(|e| e.to_string())?.as_deref().and_then(OwnerRecord::parse);
    if marker != name || record.as_ref().is_some_and(|r| r.pv == name) {
        return Ok(());
    }
    let spec = pv.spec.as_ref();
    let claim_ref = spec.and_then(|s| s.claim_ref.as_ref());
    let (Some(namespace), Some(claim), Some(class)) = (
        claim_ref.and_then(|c| c.namespace.as_deref()),
        claim_ref.and_then(|c| c.name.as_deref()),
        spec.and_then(|s| s.storage_class_name.as_deref()),
    ) else {
        return Ok(());
    };
    // The watch's copy leaves out when the PV was made: one read of it, and of the Namespace.
    let full = Api::<PersistentVolume>::all(ctx.client.clone()).get_metadata(name).await.map_err(|e| e.to_string())?;
    let Some(pv_created) = full.metadata.creation_timestamp.map(|t| t.0) else { return Ok(()) };
    let ns = Api::<Namespace>::all(ctx.client.clone()).get_metadata_opt(namespace).await.map_err(|e| e.to_string())?;
    let ns_facts =
        ns.as_ref().and_then(|n| Some((n.metadata.uid.as_deref()?, n.metadata.creation_timestamp.as_ref()?.0)));
    let earlier = EarlierDirectory {
        pv: name,
        marker_names: Some(&marker),
        record: record.as_ref(),
        claim_namespace: namespace,
        claim,
        class,
        pv_created,
        namespace: ns_facts,
    };
    let Some(new_record) = record_for_earlier_directory(&earlier) else {
        tracing::info!(pv = name, dir = %accepted.dir_name, "pathPattern directory of an earlier version: its namespace is gone or was made again since, so only an admin's adopt-directory annotation hands it on");
        return Ok(());
    };
    pool.take_over_marked(&dir, name, name, &new_record.to_xattr()).map_err(|e| e.to_string())?;
    tracing::info!(pv = name, dir = %accepted.dir_name, owner = %new_record.owner, "recorded whose the pathPattern directory of an earlier version is");
    Ok(())
}

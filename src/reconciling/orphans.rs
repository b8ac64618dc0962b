//! Start-up cleanup of directories left by a crash between creating a volume directory and its
//! PV when the claim was deleted meanwhile (DESIGN.md section 5).
//!
//! Only an *empty* directory named in our layout, with neither a PV nor a claim of its UID, is
//! removed, so no data can be lost: removal is a plain rmdir, which fails on a non-empty one.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::Api;

use crate::deciding::layout;
use crate::filesystem::VolumeDirName;
use crate::reconciling::context::Context;

/// The claim UID in a directory name of any known layout (`...pvc-<uid>`).
pub fn uid_of_dir(name: &str) -> Option<&str> {
    let uid = name.get(name.len().checked_sub(36)?..)?;
    let rest = &name[..name.len() - 36];
    (layout::is_uid(uid) && (rest == "pvc-" || rest.ends_with("-pvc-"))).then_some(uid)
}

/// On a shared pool, another node may be between creating a directory and its PV for a claim
/// this node has not seen yet: only directories untouched for this long count as orphans there.
const SHARED_ORPHAN_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes empty orphan directories in every pool. Errors are logged, never fatal.
pub async fn remove_orphan_directories(ctx: &Context) {
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    for pool_path in &ctx.config.pools {
        let pool_name = pool_path.name.as_str();
        let Some(Ok(pool)) = ctx.pools.usable(pool_name) else { continue };
        let entries = match pool.list_entries() {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(pool = %pool_name, %error, "cannot list pool for orphan cleanup");
                continue;
            }
        };
        // Snapshot claims only after listing: a directory being provisioned right now belongs to
        // a claim that was already in the store when its directory was made.
        let claim_uids: HashSet<String> = ctx.claims.state().iter().filter_map(|c| c.metadata.uid.clone()).collect();
        for entry in entries {
            let Some(uid) = uid_of_dir(&entry) else { continue };
            if claim_uids.contains(uid) {
                continue;
            }
            match pvs.get_opt(&layout::pv_name(uid)).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(error) => {
                    tracing::warn!(%error, "cannot check PVs for orphan cleanup; skipping it");
                    return;
                }
            }
            let Ok(dir) = VolumeDirName::new(&entry) else { continue };
            if pool_path.shared && !matches!(pool.entry_age(&dir), Ok(Some(age)) if age >= SHARED_ORPHAN_AGE) {
                continue;
            }
            match pool.remove_empty_volume_dir(&dir) {
                Ok(()) => {
                    tracing::info!(pool = %pool_name, dir = %entry, "removed empty directory with no claim and no PV")
                }
                Err(error) => {
                    tracing::info!(pool = %pool_name, dir = %entry, %error, "kept directory with no claim and no PV")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";

    #[test]
    fn uid_is_read_from_every_layout_and_nothing_else() {
        assert_eq!(uid_of_dir(&format!("pvc-{UID}")), Some(UID));
        assert_eq!(uid_of_dir(&format!("data-pvc-{UID}")), Some(UID));
        assert_eq!(uid_of_dir(&format!("ns-data-pvc-{UID}")), Some(UID));
        assert_eq!(uid_of_dir(&format!("x{UID}")), None);
        assert_eq!(uid_of_dir("lost+found"), None);
        assert_eq!(uid_of_dir(""), None);
        assert_eq!(uid_of_dir("é"), None);
    }
}

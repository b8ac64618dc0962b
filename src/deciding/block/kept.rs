//! A Block PV read back from the API (start-up re-attaches it, deletion releases it): its
//! paths checked before anything is done for it. Pure.
//!
//! The PV is the only record of where a Block volume's file and node are, and it can be
//! forged (or edited) by whoever may write PVs. So every path on it is accepted by the rules
//! that made it: the node must be this PV's own node under [`super::DEVICE_DIR`], the backing
//! directory a volume directory directly under a pool root named for this PV's claim, and the
//! inode a number. Whether the PV is ours and this node's is decided as for every PV, before.

use std::path::PathBuf;

use crate::deciding::block::loop_safety::Volume;
use crate::deciding::block::{
    BACKING_BIRTH_ANNOTATION, BACKING_DIR_ANNOTATION, BACKING_INODE_ANNOTATION, Birth, BlockPathRefusal,
    accept_device_path,
};
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout::{self, AcceptedPath, PathRefusal, PoolPath};

/// A Block PV's checked paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockVolumeRef {
    /// The PV name, also the node's name in the device directory.
    pub pv_name: String,
    /// The device node.
    pub node_path: PathBuf,
    /// The volume directory holding the backing file.
    pub backing_dir: AcceptedPath,
    /// What the backing file must be.
    pub volume: Volume,
    /// The backing file's birth time as recorded (none where the filesystem keeps none).
    pub recorded_birth: Option<Birth>,
}

/// Why a Block PV is not acted on (an Event on the PV; nothing attached, exposed or removed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockPvRefusal {
    /// Not a `spec.local` PV: the only kind of Block PV this provisioner writes.
    #[error("Block PV {0} has no spec.local path; this provisioner writes Block volumes as local PVs only")]
    NotLocal(String),
    /// The device node path is not this PV's.
    #[error("{0}")]
    Node(#[from] BlockPathRefusal),
    /// The backing directory is not a volume directory of this PV.
    #[error("Block PV {pv}: annotation {BACKING_DIR_ANNOTATION}: {refusal}")]
    BackingDir {
        /// The PV name.
        pv: String,
        /// Why.
        refusal: PathRefusal,
    },
    /// The file at the backing path has the recorded inode number but was born after the
    /// volume's: another file made in its place that took the freed number.
    #[error(
        "Block PV {pv}: the backing file was replaced: the file there was born at {found}, not at {recorded} as the volume's (it may carry the volume's freed inode number); it is neither attached nor detached"
    )]
    Reborn {
        /// The PV name.
        pv: String,
        /// Recorded birth time.
        recorded: String,
        /// Found birth time.
        found: String,
    },
    /// An annotation is missing or not what this provisioner writes.
    #[error("Block PV {pv}: annotation {annotation} is {found:?}; it is written when the volume is made")]
    Annotation {
        /// The PV name.
        pv: String,
        /// The annotation.
        annotation: &'static str,
        /// What it holds.
        found: Option<String>,
    },
}

/// `None` when `pv` is not a Block PV; else its checked paths, or why they are refused.
pub fn block_volume(
    pv: &KeptVolume,
    pools: &[PoolPath],
    device_dir: &std::path::Path,
) -> Option<Result<BlockVolumeRef, BlockPvRefusal>> {
    let spec = pv.spec.as_ref()?;
    (spec.volume_mode.as_deref() == Some("Block")).then(|| {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let local = spec.local.as_ref().ok_or_else(|| BlockPvRefusal::NotLocal(pv_name.clone()))?;
        let node_path = accept_device_path(&local.path, &pv_name, device_dir)?;
        let annotation = |annotation: &'static str| {
            pv.annotations.get(annotation).ok_or_else(|| BlockPvRefusal::Annotation {
                pv: pv_name.clone(),
                annotation,
                found: None,
            })
        };
        let dir = annotation(BACKING_DIR_ANNOTATION)?;
        let backing_dir = layout::accept_delete_path(dir, &pv_name, pools)
            .map_err(|refusal| BlockPvRefusal::BackingDir { pv: pv_name.clone(), refusal })?;
        let inode = annotation(BACKING_INODE_ANNOTATION)?;
        let recorded_inode = inode.parse::<u64>().map_err(|_| BlockPvRefusal::Annotation {
            pv: pv_name.clone(),
            annotation: BACKING_INODE_ANNOTATION,
            found: Some(inode.to_owned()),
        })?;
        let recorded_birth = match pv.annotations.get(BACKING_BIRTH_ANNOTATION) {
            None => None,
            Some(value) => Some(Birth::parse(value).ok_or_else(|| BlockPvRefusal::Annotation {
                pv: pv_name.clone(),
                annotation: BACKING_BIRTH_ANNOTATION,
                found: Some(value.to_owned()),
            })?),
        };
        Ok(BlockVolumeRef {
            pv_name,
            node_path,
            backing_dir,
            volume: Volume { recorded_inode: Some(recorded_inode) },
            recorded_birth,
        })
    })
}

/// Whether the file found at the backing path (its birth time `found`, where the filesystem
/// keeps one) may be the volume's: refused when both times are known and differ. A missing file
/// is left to the loop decisions.
pub fn check_birth(volume: &BlockVolumeRef, found: Option<Birth>) -> Result<(), BlockPvRefusal> {
    match (volume.recorded_birth, found) {
        (Some(recorded), Some(found)) if recorded != found => Err(BlockPvRefusal::Reborn {
            pv: volume.pv_name.clone(),
            recorded: recorded.to_annotation(),
            found: found.to_annotation(),
        }),
        _ => Ok(()),
    }
}

/// The Block PVs this node exposes at start, before it reports ready (a reboot emptied the
/// host's `/dev` and detached every loop): those of this provisioner pinned to this node, in
/// any phase (a Released one is released by its deletion, after).
pub fn served_here<'a>(
    pvs: &'a [KeptVolume],
    me: &crate::deciding::identity::Identity,
    my_hostname: &str,
) -> Vec<&'a KeptVolume> {
    pvs.iter()
        .filter(|pv| crate::deciding::volume::is_block(pv))
        .filter(|pv| pv.annotations.get(crate::keys::PROVISIONED_BY).is_some_and(|p| me.serves(p)))
        .filter(|pv| crate::deciding::volume::is_mine(pv, me, my_hostname))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use std::path::Path;

    use super::*;
    use crate::deciding::block::DEVICE_DIR;
    use crate::deciding::claim::{Decision, decide_claim};
    use crate::deciding::volume_spec::NodeFacts;
    use crate::test_fixtures::*;

    fn block_pv() -> PersistentVolume {
        let claim = claim("hpp").selected(NODE).build();
        let Decision::Provision(plan) =
            decide_claim(&claim, Some(&class("hpp", "WaitForFirstConsumer")), &me(), &config(), &[])
        else {
            panic!("provisioned")
        };
        let node = NodeFacts { name: NODE.into(), hostname: NODE.into() };
        crate::deciding::volume_spec::build_block_pv(
            &plan,
            &claim,
            &node,
            Quantity("1Gi".into()),
            4242,
            Some(BIRTH),
            Path::new(DEVICE_DIR),
        )
        .unwrap()
    }

    const BIRTH: Birth = Birth { seconds: 1_700_000_000, nanoseconds: 5 };

    fn read(pv: &PersistentVolume) -> Option<Result<BlockVolumeRef, BlockPvRefusal>> {
        block_volume(&KeptVolume::from(pv.clone()), &config().pools, Path::new(DEVICE_DIR))
    }

    fn edited(edit: impl FnOnce(&mut PersistentVolume)) -> BlockPvRefusal {
        let mut pv = block_pv();
        edit(&mut pv);
        read(&pv).expect("a Block PV").expect_err("refused")
    }

    #[test]
    fn a_block_pv_as_written_is_read_back_with_its_paths() {
        let found = read(&block_pv()).unwrap().unwrap();
        assert_eq!(found.pv_name, format!("pvc-{UID}"));
        assert_eq!(found.node_path, PathBuf::from(format!("/dev/hostpath-provisioner/pvc-{UID}")));
        assert_eq!(found.backing_dir.root, PathBuf::from("/var/hpvolumes"));
        assert_eq!(found.backing_dir.dir_name, format!("pvc-{UID}"));
        assert_eq!(found.volume, Volume { recorded_inode: Some(4242) });
        assert_eq!(found.recorded_birth, Some(BIRTH));
        assert_eq!(check_birth(&found, Some(BIRTH)), Ok(()));
        assert_eq!(check_birth(&found, None), Ok(()), "a missing file is the loop decisions' to judge");
        let later = Birth { seconds: BIRTH.seconds + 1, nanoseconds: 0 };
        assert!(matches!(check_birth(&found, Some(later)), Err(BlockPvRefusal::Reborn { .. })));
        let mut unrecorded = found.clone();
        unrecorded.recorded_birth = None;
        assert_eq!(check_birth(&unrecorded, Some(later)), Ok(()), "a filesystem without birth times: inode only");
        let mut filesystem = block_pv();
        filesystem.spec.as_mut().unwrap().volume_mode = Some("Filesystem".into());
        assert_eq!(read(&filesystem), None, "not a Block PV");
    }

    #[test]
    fn a_forged_block_pv_is_refused_before_anything_is_done() {
        let other = "pvc-11111111-2222-3333-4444-555555555555";
        let set_path = |path: String| {
            move |pv: &mut PersistentVolume| pv.spec.as_mut().unwrap().local.as_mut().unwrap().path = path
        };
        // A host device, another volume's node.
        assert!(matches!(edited(set_path("/dev/sda".into())), BlockPvRefusal::Node(_)));
        assert!(matches!(
            edited(set_path(format!("/dev/hostpath-provisioner/{other}"))),
            BlockPvRefusal::Node(BlockPathRefusal::NotItsNode { .. })
        ));
        assert!(matches!(
            edited(|pv| {
                let spec = pv.spec.as_mut().unwrap();
                spec.host_path =
                    Some(k8s_openapi::api::core::v1::HostPathVolumeSource { path: "/dev/sda".into(), type_: None });
                spec.local = None;
            }),
            BlockPvRefusal::NotLocal(_)
        ));
        let set_annotation = |key: &'static str, value: String| {
            move |pv: &mut PersistentVolume| {
                pv.metadata.annotations.as_mut().unwrap().insert(key.to_owned(), value);
            }
        };
        // Another volume's directory, a directory outside the pools, the pool root itself.
        for dir in [format!("/var/hpvolumes/{other}"), "/etc".to_owned(), "/var/hpvolumes".to_owned()] {
            assert!(
                matches!(
                    edited(set_annotation(BACKING_DIR_ANNOTATION, dir.clone())),
                    BlockPvRefusal::BackingDir { .. }
                ),
                "{dir}"
            );
        }
        assert!(matches!(
            edited(set_annotation(BACKING_INODE_ANNOTATION, "-1".into())),
            BlockPvRefusal::Annotation { annotation: BACKING_INODE_ANNOTATION, found: Some(_), .. }
        ));
        assert!(matches!(
            edited(|pv| {
                pv.metadata.annotations.as_mut().unwrap().remove(BACKING_INODE_ANNOTATION);
            }),
            BlockPvRefusal::Annotation { found: None, .. }
        ));
        assert!(matches!(
            edited(set_annotation(BACKING_BIRTH_ANNOTATION, "yesterday".into())),
            BlockPvRefusal::Annotation { annotation: BACKING_BIRTH_ANNOTATION, found: Some(_), .. }
        ));
    }

    #[test]
    fn start_up_exposes_the_block_pvs_of_this_node_and_provisioner_only() {
        let ours = KeptVolume::from(block_pv());
        let mut filesystem = block_pv();
        filesystem.spec.as_mut().unwrap().volume_mode = Some("Filesystem".into());
        let mut elsewhere = block_pv();
        elsewhere.metadata.labels.as_mut().unwrap().insert(crate::keys::NODE_LABEL.into(), "node-b".into());
        elsewhere.metadata.annotations.as_mut().unwrap().insert(crate::keys::PROVISION_ON_NODE.into(), "node-b".into());
        let mut foreign = block_pv();
        foreign.metadata.annotations.as_mut().unwrap().insert(crate::keys::PROVISIONED_BY.into(), "other.io/x".into());
        let pvs: Vec<KeptVolume> = vec![ours.clone(), filesystem.into(), elsewhere.into(), foreign.into()];
        let served = served_here(&pvs, &me(), NODE);
        assert_eq!(served.len(), 1, "{served:?}");
        assert_eq!(served[0].metadata.name, ours.metadata.name);
    }

    #[test]
    fn what_deletion_and_accounting_read_of_a_block_pv_is_its_directory_never_its_device() {
        let pv = KeptVolume::from(block_pv());
        let path = crate::deciding::volume::volume_path(&pv).expect("the backing directory");
        assert_eq!(path, format!("/var/hpvolumes/pvc-{UID}"));
        assert!(!path.starts_with("/dev"));
        let mut bare = block_pv();
        bare.metadata.annotations.as_mut().unwrap().remove(BACKING_DIR_ANNOTATION);
        assert_eq!(
            crate::deciding::volume::volume_path(&KeptVolume::from(bare)),
            None,
            "no directory, nothing removed"
        );
    }

    #[test]
    fn a_released_block_pv_is_deleted_by_its_backing_directory_in_the_pool() {
        use crate::deciding::volume::{VolumeDecision, decide_volume};
        let mut pv = block_pv();
        pv.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        let VolumeDecision::Delete(accepted) =
            decide_volume(&KeptVolume::from(pv.clone()), &me(), NODE, &config().pools, &[])
        else {
            panic!("deleted")
        };
        assert_eq!(accepted.root, PathBuf::from("/var/hpvolumes"));
        assert_eq!(accepted.dir_name, format!("pvc-{UID}"));
        // A backing directory outside the pools is refused, whatever the device path says.
        pv.metadata.annotations.as_mut().unwrap().insert(BACKING_DIR_ANNOTATION.into(), "/dev".into());
        let decision = decide_volume(&KeptVolume::from(pv), &me(), NODE, &config().pools, &[]);
        assert!(matches!(decision, VolumeDecision::Refuse(_)), "{decision:?}");
    }
}

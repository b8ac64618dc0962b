//! What a node keeps of a PersistentVolume: the fields the decisions read, decoded straight from
//! the watch, list or API answer.
//!
//! `PersistentVolume` of k8s-openapi holds every volume source of the API as a field of its spec
//! (3.4 KiB before a single string), and a node keeps one per volume it holds. The decisions read
//! the directory (`hostPath` or `local`), the size, the claim, the node affinity, the class, the
//! reclaim policy, the modes and the status: [`KeptVolume`] has those fields under the same
//! names, so a decision reads it as it would read the PV, and costs a fraction of it. A PV of
//! another volume source decodes into a `KeptVolume` without a directory, which the decisions
//! already refuse to touch.
//!
//! A `KeptVolume` is never written back: it lacks most of the object, so every change to a PV is
//! a patch of the fields it names.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, LocalVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
    PersistentVolumeStatus, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// A PersistentVolume as far as the decisions read it: its fields, read through `Deref`
/// (`pv.metadata`, `pv.spec`, `pv.status`), held once however often it is cloned. The watch cache
/// keeps a clone of every object it passes on; a clone of a `KeptVolume` is the same allocation,
/// so a node holds each volume once, not a copy beside the freed gaps of the original.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeptVolume(Arc<KeptVolumeFields>);

/// The fields of a [`KeptVolume`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct KeptVolumeFields {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<KeptVolumeSpec>,
    pub status: Option<PersistentVolumeStatus>,
}

impl std::ops::Deref for KeptVolume {
    type Target = KeptVolumeFields;

    fn deref(&self) -> &KeptVolumeFields {
        &self.0
    }
}

/// Changes one holder's volume only (copy on write): a watch trimming what it decoded, a test.
impl std::ops::DerefMut for KeptVolume {
    fn deref_mut(&mut self) -> &mut KeptVolumeFields {
        Arc::make_mut(&mut self.0)
    }
}

impl From<KeptVolumeFields> for KeptVolume {
    fn from(fields: KeptVolumeFields) -> Self {
        KeptVolume(Arc::new(fields))
    }
}

impl<'de> Deserialize<'de> for KeptVolume {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        KeptVolumeFields::deserialize(deserializer).map(KeptVolume::from)
    }
}

/// The fields of `PersistentVolumeSpec` the decisions read, named as there.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptVolumeSpec {
    pub access_modes: Option<Vec<String>>,
    pub capacity: Option<KeptCapacity>,
    pub claim_ref: Option<ObjectReference>,
    pub host_path: Option<HostPathVolumeSource>,
    pub local: Option<LocalVolumeSource>,
    pub mount_options: Option<Vec<String>>,
    pub node_affinity: Option<VolumeNodeAffinity>,
    pub persistent_volume_reclaim_policy: Option<String>,
    pub storage_class_name: Option<String>,
    pub volume_mode: Option<String>,
}

/// `spec.capacity` as far as it is read: its `storage` entry, a PV's one resource. A map of one
/// entry costs a whole B-tree node (half a KiB) per volume; this costs the quantity.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeptCapacity {
    storage: Option<Quantity>,
}

impl KeptCapacity {
    /// The quantity of `resource`, as `BTreeMap::get` would answer for the full map.
    pub fn get(&self, resource: &str) -> Option<&Quantity> {
        if resource == "storage" { self.storage.as_ref() } else { None }
    }
}

impl From<BTreeMap<String, Quantity>> for KeptCapacity {
    fn from(mut capacity: BTreeMap<String, Quantity>) -> Self {
        KeptCapacity { storage: capacity.remove("storage") }
    }
}

impl<'de> Deserialize<'de> for KeptCapacity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        BTreeMap::<String, Quantity>::deserialize(deserializer).map(KeptCapacity::from)
    }
}

impl k8s_openapi::Resource for KeptVolume {
    const API_VERSION: &'static str = <PersistentVolume as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <PersistentVolume as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <PersistentVolume as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <PersistentVolume as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <PersistentVolume as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <PersistentVolume as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for KeptVolume {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut Arc::make_mut(&mut self.0).metadata
    }
}

impl From<PersistentVolume> for KeptVolume {
    fn from(pv: PersistentVolume) -> Self {
        KeptVolumeFields { metadata: pv.metadata, spec: pv.spec.map(KeptVolumeSpec::from), status: pv.status }.into()
    }
}

impl From<PersistentVolumeSpec> for KeptVolumeSpec {
    fn from(spec: PersistentVolumeSpec) -> Self {
        KeptVolumeSpec {
            access_modes: spec.access_modes,
            capacity: spec.capacity.map(KeptCapacity::from),
            claim_ref: spec.claim_ref,
            host_path: spec.host_path,
            local: spec.local,
            mount_options: spec.mount_options,
            node_affinity: spec.node_affinity,
            persistent_volume_reclaim_policy: spec.persistent_volume_reclaim_policy,
            storage_class_name: spec.storage_class_name,
            volume_mode: spec.volume_mode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PV as the API server sends it, with a volume source the decisions never read.
    const PV_JSON: &str = r#"{
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pvc-1", "uid": "u-1", "resourceVersion": "7",
                     "labels": {"hostpath-provisioner.kubevirt.io/node": "n1"},
                     "annotations": {"pv.kubernetes.io/provisioned-by": "kubevirt.io/hostpath-provisioner"},
                     "finalizers": ["kubernetes.io/pv-protection"]},
        "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                 "claimRef": {"namespace": "ns", "name": "data", "uid": "c-1"},
                 "hostPath": {"path": "/var/hpvolumes/pvc-1", "type": ""},
                 "mountOptions": ["noatime"],
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}},
                 "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "hpp",
                 "volumeMode": "Filesystem", "nfs": {"server": "x", "path": "/y"}},
        "status": {"phase": "Bound"}
    }"#;

    #[test]
    fn a_kept_volume_holds_what_the_full_pv_holds_of_the_fields_decisions_read() {
        let full: PersistentVolume = serde_json::from_str(PV_JSON).unwrap();
        let kept: KeptVolume = serde_json::from_str(PV_JSON).unwrap();
        assert_eq!(kept, KeptVolume::from(full));
        let spec = kept.spec.as_ref().unwrap();
        assert_eq!(spec.host_path.as_ref().unwrap().path, "/var/hpvolumes/pvc-1");
        assert_eq!(spec.claim_ref.as_ref().unwrap().uid.as_deref(), Some("c-1"));
        assert_eq!(spec.capacity.as_ref().unwrap().get("storage").unwrap().0, "1Gi");
        assert_eq!(spec.capacity.as_ref().unwrap().get("cpu"), None);
        assert_eq!(spec.mount_options.as_deref(), Some(&["noatime".to_string()][..]));
        assert_eq!(kept.status.as_ref().unwrap().phase.as_deref(), Some("Bound"));
        assert_eq!(kept.metadata.finalizers.as_deref().unwrap(), ["kubernetes.io/pv-protection"]);
    }

    #[test]
    fn a_kept_volume_is_a_fraction_of_a_persistent_volume() {
        // The reason the type exists: the spec of every volume source is not kept.
        assert!(
            std::mem::size_of::<KeptVolumeFields>() * 2 < std::mem::size_of::<PersistentVolume>(),
            "{} vs {}",
            std::mem::size_of::<KeptVolumeFields>(),
            std::mem::size_of::<PersistentVolume>()
        );
    }

    #[test]
    fn a_clone_is_the_same_volume_until_one_holder_changes_it() {
        let kept: KeptVolume = serde_json::from_str(PV_JSON).unwrap();
        let mut clone = kept.clone();
        assert!(Arc::ptr_eq(&kept.0, &clone.0), "the watch cache's clone must not copy the volume");
        clone.metadata.name = Some("changed".into());
        assert_eq!(kept.metadata.name.as_deref(), Some("pvc-1"), "a change reaches one holder only");
        assert_eq!(clone.metadata.name.as_deref(), Some("changed"));
    }

    #[test]
    fn it_is_watched_as_persistent_volumes() {
        use kube::Resource;
        assert_eq!(KeptVolume::kind(&()), "PersistentVolume");
        assert_eq!(KeptVolume::plural(&()), "persistentvolumes");
        assert_eq!(KeptVolume::api_version(&()), "v1");
    }
}

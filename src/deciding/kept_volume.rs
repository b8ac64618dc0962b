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
//! Labels and annotations are kept beside the metadata, not in it ([`KeptVolumeFields::labels`],
//! [`KeptVolumeFields::annotations`]): `ObjectMeta` holds each as a B-tree map, whose first node
//! alone is 544 bytes, and a PV of ours has a few entries in each. `metadata.labels` and
//! `metadata.annotations` of a `KeptVolume` are always empty.
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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::Deserialize;

/// A PersistentVolume as far as the decisions read it: its fields, read through `Deref`
/// (`pv.metadata`, `pv.labels`, `pv.annotations`, `pv.spec`, `pv.status`), held once however
/// often it is cloned. The watch cache keeps a clone of every object it passes on; a clone of a
/// `KeptVolume` is the same allocation, so a node holds each volume once, not a copy beside the
/// freed gaps of the original.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeptVolume(Arc<KeptVolumeFields>);

/// The fields of a [`KeptVolume`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeptVolumeFields {
    /// The PV's metadata without its labels and annotations (kept below) and managedFields.
    pub metadata: ObjectMeta,
    /// `metadata.labels`.
    pub labels: KeptMap,
    /// `metadata.annotations`.
    pub annotations: KeptMap,
    pub spec: Option<KeptVolumeSpec>,
    pub status: Option<PersistentVolumeStatus>,
}

/// Labels or annotations of a kept volume: the entries in one allocation, sorted by key, where
/// `ObjectMeta`'s B-tree map takes a 544-byte node before the first entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeptMap(Box<[(Box<str>, Box<str>)]>);

impl KeptMap {
    /// The value under `key`, as `BTreeMap::get` answers.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|i| &*self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets `key` to `value` (a test's change, or a watch's: never written back to the API).
    pub fn insert(&mut self, key: &str, value: &str) {
        let mut entries: BTreeMap<&str, &str> = self.iter().collect();
        entries.insert(key, value);
        *self = KeptMap::from_entries(entries);
    }

    pub fn remove(&mut self, key: &str) {
        *self = KeptMap::from_entries(self.iter().filter(|(k, _)| *k != key).collect::<Vec<_>>());
    }

    fn from_entries<K: AsRef<str>, V: AsRef<str>>(entries: impl IntoIterator<Item = (K, V)>) -> Self {
        let mut entries: Vec<(Box<str>, Box<str>)> =
            entries.into_iter().map(|(k, v)| (Box::from(k.as_ref()), Box::from(v.as_ref()))).collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, earlier| later.0 == earlier.0);
        KeptMap(entries.into_boxed_slice())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> From<[(K, V); N]> for KeptMap {
    fn from(entries: [(K, V); N]) -> Self {
        KeptMap::from_entries(entries)
    }
}

impl From<BTreeMap<String, String>> for KeptMap {
    fn from(map: BTreeMap<String, String>) -> Self {
        KeptMap::from_entries(map)
    }
}

/// Decoded entry by entry into the final slice: no B-tree map is built on the way.
impl<'de> Deserialize<'de> for KeptMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = KeptMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<KeptMap, A::Error> {
                let mut entries: Vec<(Box<str>, Box<str>)> = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((key, value)) = map.next_entry::<Box<str>, Box<str>>()? {
                    entries.push((key, value));
                }
                entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                entries.dedup_by(|later, earlier| later.0 == earlier.0);
                Ok(KeptMap(entries.into_boxed_slice()))
            }
        }
        deserializer.deserialize_option(OptionalMap(Entries))
    }
}

/// `null` or absent is an empty map, as `Option<BTreeMap>` would be `None`.
struct OptionalMap<V>(V);

impl<'de, V: serde::de::Visitor<'de, Value = KeptMap>> serde::de::Visitor<'de> for OptionalMap<V> {
    type Value = KeptMap;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.expecting(f)
    }
    fn visit_none<E>(self) -> Result<KeptMap, E> {
        Ok(KeptMap::default())
    }
    fn visit_unit<E>(self) -> Result<KeptMap, E> {
        Ok(KeptMap::default())
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<KeptMap, D::Error> {
        deserializer.deserialize_map(self.0)
    }
}

/// The metadata of a PV as it is decoded: `ObjectMeta`'s fields a node keeps, with labels and
/// annotations as [`KeptMap`]s. managedFields and the rest are skipped by the decoder.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct WireMetadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    finalizers: Option<Vec<String>>,
    owner_references: Option<Vec<OwnerReference>>,
    labels: KeptMap,
    annotations: KeptMap,
}

#[derive(Deserialize)]
struct WireVolume {
    #[serde(default)]
    metadata: WireMetadata,
    spec: Option<KeptVolumeSpec>,
    status: Option<PersistentVolumeStatus>,
}

impl WireMetadata {
    /// The metadata a node keeps, and the labels and annotations beside it.
    fn into_parts(self) -> (ObjectMeta, KeptMap, KeptMap) {
        let metadata = ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            generation: self.generation,
            creation_timestamp: self.creation_timestamp,
            deletion_timestamp: self.deletion_timestamp,
            deletion_grace_period_seconds: self.deletion_grace_period_seconds,
            finalizers: self.finalizers,
            owner_references: self.owner_references,
            ..Default::default()
        };
        (metadata, self.labels, self.annotations)
    }
}

impl From<ObjectMeta> for WireMetadata {
    fn from(meta: ObjectMeta) -> Self {
        WireMetadata {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            resource_version: meta.resource_version,
            generation: meta.generation,
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
            deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
            finalizers: meta.finalizers,
            owner_references: meta.owner_references,
            labels: meta.labels.map(KeptMap::from).unwrap_or_default(),
            annotations: meta.annotations.map(KeptMap::from).unwrap_or_default(),
        }
    }
}

impl<'de> Deserialize<'de> for KeptVolumeFields {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let WireVolume { metadata, spec, status } = WireVolume::deserialize(deserializer)?;
        let (metadata, labels, annotations) = metadata.into_parts();
        Ok(KeptVolumeFields { metadata, labels, annotations, spec, status })
    }
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
    pub claim_ref: Option<KeptClaimRef>,
    pub host_path: Option<HostPathVolumeSource>,
    pub local: Option<LocalVolumeSource>,
    pub mount_options: Option<Vec<String>>,
    pub node_affinity: Option<VolumeNodeAffinity>,
    pub persistent_volume_reclaim_policy: Option<String>,
    pub storage_class_name: Option<String>,
    pub volume_mode: Option<String>,
}

/// `spec.claimRef` as far as it is read: which claim, by namespace, name and uid. Its kind, API
/// version and resource version are not kept.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct KeptClaimRef {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub uid: Option<String>,
}

impl From<ObjectReference> for KeptClaimRef {
    fn from(reference: ObjectReference) -> Self {
        KeptClaimRef { name: reference.name, namespace: reference.namespace, uid: reference.uid }
    }
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
        let (metadata, labels, annotations) = WireMetadata::from(pv.metadata).into_parts();
        KeptVolumeFields { metadata, labels, annotations, spec: pv.spec.map(KeptVolumeSpec::from), status: pv.status }
            .into()
    }
}

impl From<PersistentVolumeSpec> for KeptVolumeSpec {
    fn from(spec: PersistentVolumeSpec) -> Self {
        KeptVolumeSpec {
            access_modes: spec.access_modes,
            capacity: spec.capacity.map(KeptCapacity::from),
            claim_ref: spec.claim_ref.map(KeptClaimRef::from),
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
                     "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}],
                     "labels": {"hostpath-provisioner.kubevirt.io/node": "n1"},
                     "annotations": {"pv.kubernetes.io/provisioned-by": "kubevirt.io/hostpath-provisioner"},
                     "finalizers": ["kubernetes.io/pv-protection"]},
        "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                 "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "ns",
                              "name": "data", "uid": "c-1", "resourceVersion": "5"},
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
        assert_eq!(kept.labels.get("hostpath-provisioner.kubevirt.io/node"), Some("n1"));
        assert_eq!(kept.annotations.get("pv.kubernetes.io/provisioned-by"), Some("kubevirt.io/hostpath-provisioner"));
        assert_eq!(kept.annotations.get("pv.kubernetes.io/bound-by-controller"), None);
        assert_eq!(spec.claim_ref.as_ref().unwrap().name.as_deref(), Some("data"));
        assert_eq!(spec.claim_ref.as_ref().unwrap().namespace.as_deref(), Some("ns"));
    }

    #[test]
    fn labels_and_annotations_are_kept_beside_the_metadata_not_in_it() {
        let kept: KeptVolume = serde_json::from_str(PV_JSON).unwrap();
        assert_eq!(kept.metadata.labels, None);
        assert_eq!(kept.metadata.annotations, None);
        assert_eq!(kept.metadata.managed_fields, None);
        assert_eq!(kept.metadata.name.as_deref(), Some("pvc-1"));
        assert_eq!(kept.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn absent_or_null_maps_are_empty_and_a_map_answers_as_a_b_tree_map() {
        let bare: KeptVolume = serde_json::from_str(r#"{"metadata": {"name": "a", "labels": null}}"#).unwrap();
        assert!(bare.labels.is_empty() && bare.annotations.is_empty());
        let none: KeptVolume = serde_json::from_str("{}").unwrap();
        assert!(none.labels.is_empty());
        let unsorted: KeptVolume =
            serde_json::from_str(r#"{"metadata": {"annotations": {"z": "1", "a": "2", "m": "3"}}}"#).unwrap();
        let keys: Vec<&str> = unsorted.annotations.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "m", "z"]);
        for (key, value) in [("a", Some("2")), ("m", Some("3")), ("z", Some("1")), ("b", None), ("", None)] {
            assert_eq!(unsorted.annotations.get(key), value, "{key}");
        }
        let mut changed = unsorted.annotations.clone();
        changed.insert("b", "4");
        changed.insert("a", "5");
        changed.remove("z");
        assert_eq!(changed.iter().collect::<Vec<_>>(), [("a", "5"), ("b", "4"), ("m", "3")]);
        assert!(serde_json::from_str::<KeptVolume>(r#"{"metadata": {"labels": ["x"]}}"#).is_err());
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

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
    HostPathVolumeSource, LocalVolumeSource, NodeSelectorRequirement, ObjectReference, PersistentVolume,
    PersistentVolumeSpec, PersistentVolumeStatus, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Deserialize;

use crate::deciding::interning::{Word, Words, intern, optional_word, optional_words, word};

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
    pub status: Option<KeptVolumeStatus>,
}

/// Labels or annotations of a kept volume: the entries in one allocation, sorted by key, each key
/// and value shared with every other volume that carries it (deciding::interning), where
/// `ObjectMeta`'s B-tree map takes a 544-byte node before the first entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeptMap(Box<[(Arc<str>, Arc<str>)]>);

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
        KeptMap::sorted(entries.into_iter().map(|(k, v)| (intern(k.as_ref()), intern(v.as_ref()))).collect())
    }

    /// The map of `entries`, the last of a repeated key winning as in a decoded JSON object.
    fn sorted(mut entries: Vec<(Arc<str>, Arc<str>)>) -> Self {
        entries.reverse();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
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
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((key, value)) = map.next_entry::<Word, Word>()? {
                    entries.push((key.0, value.0));
                }
                Ok(KeptMap::sorted(entries))
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

/// The metadata of a PV as it is decoded: the `ObjectMeta` fields a decision or the watch cache
/// reads, with labels and annotations as [`KeptMap`]s. managedFields, owner references, times
/// other than the deletion's and the rest are skipped by the decoder.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct WireMetadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    labels: KeptMap,
    annotations: KeptMap,
}

#[derive(Deserialize)]
struct WireVolume {
    #[serde(default)]
    metadata: WireMetadata,
    spec: Option<KeptVolumeSpec>,
    status: Option<KeptVolumeStatus>,
}

impl WireMetadata {
    /// The metadata a node keeps, and the labels and annotations beside it.
    fn into_parts(self) -> (ObjectMeta, KeptMap, KeptMap) {
        let metadata = ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            deletion_timestamp: self.deletion_timestamp,
            // A decoded list grows to four entries for its first: kept at its length.
            finalizers: self.finalizers.map(|mut f| {
                f.shrink_to_fit();
                f
            }),
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
            deletion_timestamp: meta.deletion_timestamp,
            finalizers: meta.finalizers,
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

/// The fields of `PersistentVolumeSpec` the decisions read, named as there. The words a node's
/// volumes repeat (class, reclaim policy, volume mode) are shared (deciding::interning).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptVolumeSpec {
    pub capacity: Option<KeptCapacity>,
    pub claim_ref: Option<KeptClaimRef>,
    pub host_path: Option<KeptDirectory>,
    pub local: Option<KeptDirectory>,
    pub node_affinity: Option<KeptNodeAffinity>,
    #[serde(default, deserialize_with = "optional_word")]
    pub persistent_volume_reclaim_policy: Option<Arc<str>>,
    #[serde(default, deserialize_with = "optional_word")]
    pub storage_class_name: Option<Arc<str>>,
    #[serde(default, deserialize_with = "optional_word")]
    pub volume_mode: Option<Arc<str>>,
}

/// `spec.hostPath` or `spec.local` as far as it is read: the directory. The hostPath's type and
/// the local volume's fsType are the kubelet's to read, not a node's decisions.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct KeptDirectory {
    pub path: String,
}

impl From<HostPathVolumeSource> for KeptDirectory {
    fn from(source: HostPathVolumeSource) -> Self {
        KeptDirectory { path: source.path }
    }
}

impl From<LocalVolumeSource> for KeptDirectory {
    fn from(source: LocalVolumeSource) -> Self {
        KeptDirectory { path: source.path }
    }
}

/// `spec.nodeAffinity`, named as there, each list in an allocation of its length and each word
/// shared. `matchFields` is not kept: no decision reads it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct KeptNodeAffinity {
    pub required: Option<KeptNodeSelector>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptNodeSelector {
    pub node_selector_terms: Box<[KeptNodeSelectorTerm]>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptNodeSelectorTerm {
    pub match_expressions: Option<Box<[KeptNodeSelectorRequirement]>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct KeptNodeSelectorRequirement {
    #[serde(deserialize_with = "word")]
    pub key: Arc<str>,
    #[serde(deserialize_with = "word")]
    pub operator: Arc<str>,
    #[serde(default, deserialize_with = "optional_words")]
    pub values: Option<Words>,
}

impl From<VolumeNodeAffinity> for KeptNodeAffinity {
    fn from(affinity: VolumeNodeAffinity) -> Self {
        let requirement = |r: NodeSelectorRequirement| KeptNodeSelectorRequirement {
            key: intern(&r.key),
            operator: intern(&r.operator),
            values: r.values.map(|values| values.iter().map(|v| intern(v)).collect()),
        };
        KeptNodeAffinity {
            required: affinity.required.map(|selector| KeptNodeSelector {
                node_selector_terms: selector
                    .node_selector_terms
                    .into_iter()
                    .map(|term| KeptNodeSelectorTerm {
                        match_expressions: term.match_expressions.map(|e| e.into_iter().map(requirement).collect()),
                    })
                    .collect(),
            }),
        }
    }
}

/// `status` as far as it is read: the phase.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct KeptVolumeStatus {
    #[serde(default, deserialize_with = "optional_word")]
    pub phase: Option<Arc<str>>,
}

impl From<PersistentVolumeStatus> for KeptVolumeStatus {
    fn from(status: PersistentVolumeStatus) -> Self {
        KeptVolumeStatus { phase: status.phase.as_deref().map(intern) }
    }
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
        KeptVolumeFields {
            metadata,
            labels,
            annotations,
            spec: pv.spec.map(KeptVolumeSpec::from),
            status: pv.status.map(KeptVolumeStatus::from),
        }
        .into()
    }
}

impl From<PersistentVolumeSpec> for KeptVolumeSpec {
    fn from(spec: PersistentVolumeSpec) -> Self {
        KeptVolumeSpec {
            capacity: spec.capacity.map(KeptCapacity::from),
            claim_ref: spec.claim_ref.map(KeptClaimRef::from),
            host_path: spec.host_path.map(KeptDirectory::from),
            local: spec.local.map(KeptDirectory::from),
            node_affinity: spec.node_affinity.map(KeptNodeAffinity::from),
            persistent_volume_reclaim_policy: spec.persistent_volume_reclaim_policy.as_deref().map(intern),
            storage_class_name: spec.storage_class_name.as_deref().map(intern),
            volume_mode: spec.volume_mode.as_deref().map(intern),
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
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("hpp"));
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
        let terms = &spec.node_affinity.as_ref().unwrap().required.as_ref().unwrap().node_selector_terms;
        let [term] = &terms[..] else { panic!("one term: {terms:?}") };
        let [expr] = term.match_expressions.as_deref().unwrap() else { panic!("one expression: {term:?}") };
        assert_eq!((&*expr.key, &*expr.operator), ("kubernetes.io/hostname", "In"));
        assert_eq!(expr.values.as_deref().unwrap(), [Arc::from("n1")]);
        assert_eq!(kept.status.as_ref().unwrap().phase.as_deref(), Some("Bound"));
        assert_eq!(kept.metadata.finalizers.as_deref().unwrap(), ["kubernetes.io/pv-protection"]);
        assert_eq!(kept.labels.get("hostpath-provisioner.kubevirt.io/node"), Some("n1"));
        assert_eq!(kept.annotations.get("pv.kubernetes.io/provisioned-by"), Some("kubevirt.io/hostpath-provisioner"));
        assert_eq!(kept.annotations.get("pv.kubernetes.io/bound-by-controller"), None);
        assert_eq!(spec.claim_ref.as_ref().unwrap().name.as_deref(), Some("data"));
        assert_eq!(spec.claim_ref.as_ref().unwrap().namespace.as_deref(), Some("ns"));
    }

    #[test]
    fn volumes_share_the_words_they_repeat_and_keep_lists_at_their_length() {
        let one: KeptVolume = serde_json::from_str(PV_JSON).unwrap();
        let two: KeptVolume = serde_json::from_str(&PV_JSON.replace("pvc-1", "pvc-2")).unwrap();
        assert_ne!(one.metadata.name, two.metadata.name);
        let (a, b) = (one.spec.as_ref().unwrap(), two.spec.as_ref().unwrap());
        let same = |x: &Option<Arc<str>>, y: &Option<Arc<str>>| Arc::ptr_eq(x.as_ref().unwrap(), y.as_ref().unwrap());
        assert!(same(&a.storage_class_name, &b.storage_class_name));
        assert!(same(&a.persistent_volume_reclaim_policy, &b.persistent_volume_reclaim_policy));
        assert!(same(&a.volume_mode, &b.volume_mode));
        assert!(same(&one.status.as_ref().unwrap().phase, &two.status.as_ref().unwrap().phase));
        let expression = |spec: &KeptVolumeSpec| {
            spec.node_affinity.as_ref().unwrap().required.as_ref().unwrap().node_selector_terms[0]
                .match_expressions
                .as_ref()
                .unwrap()[0]
                .clone()
        };
        let (x, y) = (expression(a), expression(b));
        assert!(Arc::ptr_eq(&x.key, &y.key) && Arc::ptr_eq(&x.operator, &y.operator));
        assert!(Arc::ptr_eq(&x.values.as_ref().unwrap()[0], &y.values.as_ref().unwrap()[0]));
        let (label, other) = (one.labels.0[0].clone(), two.labels.0[0].clone());
        assert!(Arc::ptr_eq(&label.0, &other.0) && Arc::ptr_eq(&label.1, &other.1));
        // serde grows a list to four entries for its first; a kept one has its length.
        assert_eq!(one.metadata.finalizers.as_ref().unwrap().capacity(), 1);
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_as_a_decoded_map_would() {
        let kept: KeptVolume =
            serde_json::from_str(r#"{"metadata": {"labels": {"a": "1", "b": "2", "a": "3"}}}"#).unwrap();
        assert_eq!(kept.labels.iter().collect::<Vec<_>>(), [("a", "3"), ("b", "2")]);
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

//! Shared pieces of the fuzz targets: structured input generators (claims, classes, PVs) and a
//! reference model of the path rules of docs/architecture.md, deletion rules.
//!
//! The model is written from the design text, independently of `src/layout.rs`, so that the
//! targets compare two implementations instead of re-running the code under test against itself.

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use hostpath_provisioner::deciding::identity::Identity;
use hostpath_provisioner::deciding::kept_volume::KeptVolume;
use hostpath_provisioner::deciding::layout::{self, AcceptedPath, PoolPath};
use hostpath_provisioner::deciding::settings::{DecisionConfig, ProvisionOnNodePolicy, PvCapacity};
use hostpath_provisioner::filesystem::VolumeDirName;
use hostpath_provisioner::keys;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeSpec, PersistentVolumeStatus,
    TypedLocalObjectReference, TypedObjectReference, VolumeNodeAffinity, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};

/// Provisioner name of "this" provisioner in every target.
pub const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";
/// Node name of "this" node.
pub const NODE: &str = "node-a";
/// This node's `kubernetes.io/hostname` label value (differs from the node name on purpose).
pub const HOSTNAME: &str = "node-a-host";
/// Some other node.
pub const OTHER_NODE: &str = "node-b";
/// Root of the default pool.
pub const POOL_ROOT: &str = "/var/hpvolumes";
/// Root of the second pool (claims and PVs may name it).
pub const FAST_ROOT: &str = "/mnt/fast-disk";
/// A fixed valid claim UID.
pub const UID: &str = "0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";

/// Who "we" are.
pub fn me() -> Identity {
    Identity { provisioner: PROVISIONER.into(), node: NODE.into(), affinity: Vec::new() }
}

/// The single default pool, as the `accept_delete_path` target uses it.
pub fn default_pool() -> Vec<PoolPath> {
    vec![PoolPath::local("legacy", POOL_ROOT)]
}

/// Two pools, so that pool selection and multi-root acceptance are exercised.
pub fn two_pools() -> Vec<PoolPath> {
    vec![PoolPath::local("legacy", POOL_ROOT), PoolPath::local("fast", FAST_ROOT)]
}

/// Splits a text fuzz input into at most `n` newline-separated fields (missing ones are empty).
pub fn fields(text: &str, n: usize) -> Vec<&str> {
    let mut out: Vec<&str> = text.splitn(n, '\n').collect();
    out.resize(n, "");
    out
}

// ---------------------------------------------------------------------------------------------
// Reference model (docs/architecture.md, deletion rules)
// ---------------------------------------------------------------------------------------------

/// A Kubernetes UID: 8-4-4-4-12 lowercase hex digits.
pub fn model_is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// A DNS-1123 subdomain as the API server checks it: dot-separated non-empty labels of `[a-z0-9-]`
/// (no limit of their own), not starting or ending with
/// '-', 253 bytes at most in all.
pub fn model_is_dns_subdomain(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Lexical normalisation: the components of an absolute path with empty and `.` components
/// dropped; `None` for a relative path or one with a `..` component.
pub fn model_components(path: &str) -> Option<Vec<&str>> {
    let rest = path.strip_prefix('/')?;
    let mut out = Vec::new();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            other => out.push(other),
        }
    }
    Some(out)
}

/// One of the directory layouts either build wrote for PV `pv`: `pvc-<uid>` or
/// `<prefix>-pvc-<uid>` with a prefix of DNS characters starting with a letter or digit, the whole
/// name fitting in 255 bytes.
pub fn model_layout_ok(dir: &str, pv: &str) -> bool {
    if dir == pv {
        return true;
    }
    let Some(prefix) = dir.strip_suffix(pv).and_then(|p| p.strip_suffix('-')) else { return false };
    dir.len() <= 255
        && prefix.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && prefix.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.'))
}

/// What the deletion rules accept for `host_path` of PV `pv`: the pool name and directory name,
/// or `None` when nothing may be deleted.
pub fn model_accept(host_path: &str, pv: &str, pools: &[PoolPath]) -> Option<(String, String)> {
    if !pv.strip_prefix("pvc-").is_some_and(model_is_uid) {
        return None;
    }
    let comps = model_components(host_path)?;
    let (dir, parent) = comps.split_last()?;
    let pool = pools.iter().find(|p| {
        let root = p.root.to_str().and_then(model_components);
        root.as_deref() == Some(parent)
    })?;
    model_layout_ok(dir, pv).then(|| (pool.name.clone(), (*dir).to_owned()))
}

/// Every property an accepted deletion path must have; panics (a fuzz finding) otherwise.
pub fn check_accepted(host_path: &str, pv_name: &str, accepted: &AcceptedPath, pools: &[PoolPath]) {
    let dir = accepted.dir_name.as_str();
    assert!(!dir.is_empty(), "accepted an empty directory name for {host_path:?}");
    assert!(!dir.contains('/'), "accepted dir name {dir:?} has a '/'");
    assert!(!dir.contains('\0'), "accepted dir name {dir:?} has a NUL");
    assert!(dir != "." && dir != "..", "accepted dir name {dir:?} is . or ..");
    assert!(VolumeDirName::new(dir).is_ok(), "accepted dir name {dir:?} is not a VolumeDirName");
    let pool = pools
        .iter()
        .find(|p| p.name == accepted.pool)
        .unwrap_or_else(|| panic!("accepted pool {:?} is not configured", accepted.pool));
    // root.join(dir), normalised, is a direct child of the root.
    let joined = pool.root.join(dir);
    let joined_comps = model_components(joined.to_str().expect("UTF-8 path")).expect("joined path normalises");
    let root_comps = model_components(pool.root.to_str().expect("UTF-8 root")).expect("root normalises");
    assert_eq!(joined_comps.len(), root_comps.len() + 1, "{joined:?} is not a direct child of {:?}", pool.root);
    assert_eq!(joined_comps[..root_comps.len()], root_comps[..], "{joined:?} left the root {:?}", pool.root);
    assert_eq!(joined_comps.last().copied(), Some(dir));
    // The PV is named after a claim UID and the directory ends with that name.
    let uid = pv_name.strip_prefix("pvc-").unwrap_or_else(|| panic!("accepted foreign PV name {pv_name:?}"));
    assert!(model_is_uid(uid), "accepted PV name {pv_name:?} without a UID");
    assert!(dir.ends_with(pv_name), "accepted dir {dir:?} does not end with {pv_name:?}");
    assert!(model_layout_ok(dir, pv_name), "accepted dir {dir:?} is not a known layout of {pv_name:?}");
    // And the path the PV named is that very directory.
    assert_eq!(
        model_accept(host_path, pv_name, pools),
        Some((accepted.pool.clone(), dir.to_owned())),
        "accepted {host_path:?} for {pv_name:?} but the model does not"
    );
}

// ---------------------------------------------------------------------------------------------
// Generators shared by the structured targets
// ---------------------------------------------------------------------------------------------

const DNS_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-.";

/// A claim UID.
#[derive(Arbitrary, Clone, Debug)]
pub enum UidGen {
    /// A well-formed UID built from 16 bytes.
    Valid([u8; 16]),
    /// Anything.
    Raw(String),
}

impl UidGen {
    /// The UID text.
    pub fn render(&self) -> String {
        match self {
            Self::Valid(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
            }
            Self::Raw(s) => s.clone(),
        }
    }
}

/// A claim name or namespace.
#[derive(Arbitrary, Clone, Debug)]
pub enum NameGen {
    /// `data`.
    Data,
    /// Bytes mapped onto DNS characters (often valid, sometimes long).
    Dns(Vec<u8>),
    /// Anything.
    Raw(String),
}

impl NameGen {
    /// The name text.
    pub fn render(&self) -> String {
        match self {
            Self::Data => "data".into(),
            Self::Dns(bytes) => bytes.iter().map(|b| DNS_ALPHABET[*b as usize % DNS_ALPHABET.len()] as char).collect(),
            Self::Raw(s) => s.clone(),
        }
    }
}

/// An annotation key: the real keys of `src/keys.rs`, or anything.
#[derive(Arbitrary, Clone, Debug)]
pub enum AnnKey {
    /// `kubevirt.io/provisionOnNode`.
    ProvisionOnNode,
    /// `volume.kubernetes.io/selected-node`.
    SelectedNode,
    /// `volume.kubernetes.io/storage-provisioner`.
    StorageProvisioner,
    /// `volume.beta.kubernetes.io/storage-provisioner`.
    StorageProvisionerBeta,
    /// `volume.beta.kubernetes.io/storage-class`.
    StorageClassBeta,
    /// `pv.kubernetes.io/bind-completed`.
    BindCompleted,
    /// `pv.kubernetes.io/provisioned-by`.
    ProvisionedBy,
    /// `hostPathProvisionerIdentity`.
    ProvisionerIdentity,
    /// `hostpath-provisioner.kubevirt.io/node`.
    NodeLabel,
    /// Anything.
    Raw(String),
}

impl AnnKey {
    /// The key text.
    pub fn render(&self) -> String {
        match self {
            Self::ProvisionOnNode => keys::PROVISION_ON_NODE.into(),
            Self::SelectedNode => keys::SELECTED_NODE.into(),
            Self::StorageProvisioner => keys::STORAGE_PROVISIONER.into(),
            Self::StorageProvisionerBeta => keys::STORAGE_PROVISIONER_BETA.into(),
            Self::StorageClassBeta => keys::STORAGE_CLASS_BETA.into(),
            Self::BindCompleted => keys::BIND_COMPLETED.into(),
            Self::ProvisionedBy => keys::PROVISIONED_BY.into(),
            Self::ProvisionerIdentity => keys::PROVISIONER_IDENTITY.into(),
            Self::NodeLabel => keys::NODE_LABEL.into(),
            Self::Raw(s) => s.clone(),
        }
    }
}

/// An annotation (or affinity) value.
#[derive(Arbitrary, Clone, Debug)]
pub enum AnnValue {
    /// This node's name.
    MyNode,
    /// This node's hostname label.
    MyHostname,
    /// Another node.
    OtherNode,
    /// Our provisioner name.
    MyProvisioner,
    /// Another provisioner.
    OtherProvisioner,
    /// `hostpath`, the class name the generators use.
    ClassName,
    /// `""`.
    Empty,
    /// `yes`.
    Yes,
    /// Anything.
    Raw(String),
}

impl AnnValue {
    /// The value text.
    pub fn render(&self) -> String {
        match self {
            Self::MyNode => NODE.into(),
            Self::MyHostname => HOSTNAME.into(),
            Self::OtherNode => OTHER_NODE.into(),
            Self::MyProvisioner => PROVISIONER.into(),
            Self::OtherProvisioner => "example.com/other".into(),
            Self::ClassName => "hostpath".into(),
            Self::Empty => String::new(),
            Self::Yes => "yes".into(),
            Self::Raw(s) => s.clone(),
        }
    }
}

fn annotations(pairs: &[(AnnKey, AnnValue)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.render(), v.render())).collect()
}

fn deletion_timestamp(deleting: bool) -> Option<Time> {
    deleting.then(|| Time(Default::default()))
}

// ---------------------------------------------------------------------------------------------
// Claims and classes
// ---------------------------------------------------------------------------------------------

/// A storage request.
#[derive(Arbitrary, Clone, Debug)]
pub enum QuantityGen {
    /// `<n><suffix>` with a known suffix.
    Number(u32, u8),
    /// Anything.
    Raw(String),
}

impl QuantityGen {
    fn render(&self) -> String {
        const SUFFIXES: [&str; 9] = ["", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "m"];
        match self {
            Self::Number(n, s) => format!("{n}{}", SUFFIXES[*s as usize % SUFFIXES.len()]),
            Self::Raw(s) => s.clone(),
        }
    }
}

/// A claim's access mode.
#[derive(Arbitrary, Clone, Debug)]
pub enum AccessModeGen {
    /// `ReadWriteOnce`.
    Rwo,
    /// `ReadWriteOncePod`.
    Rwop,
    /// `ReadOnlyMany`.
    Rox,
    /// `ReadWriteMany`.
    Rwx,
    /// Anything.
    Raw(String),
}

impl AccessModeGen {
    fn render(&self) -> String {
        match self {
            Self::Rwo => "ReadWriteOnce".into(),
            Self::Rwop => "ReadWriteOncePod".into(),
            Self::Rox => "ReadOnlyMany".into(),
            Self::Rwx => "ReadWriteMany".into(),
            Self::Raw(s) => s.clone(),
        }
    }
}

/// A text field that is usually one of a few meaningful values.
#[derive(Arbitrary, Clone, Debug)]
pub enum Choice {
    /// The first meaningful value.
    A,
    /// The second meaningful value.
    B,
    /// Anything.
    Raw(String),
}

impl Choice {
    fn render(&self, a: &str, b: &str) -> String {
        match self {
            Self::A => a.into(),
            Self::B => b.into(),
            Self::Raw(s) => s.clone(),
        }
    }
}

/// A StorageClass.
#[derive(Arbitrary, Clone, Debug)]
pub struct ClassInput {
    /// A: ours, B: another provisioner.
    pub provisioner: Choice,
    /// A: Immediate, B: WaitForFirstConsumer. Unset means WaitForFirstConsumer when the claim's
    /// placement is `Selected*` (what the scheduler's annotation implies), else unset (Immediate).
    pub binding_mode: Option<Choice>,
    /// Key A: storagePool; value A: legacy, B: fast.
    pub parameters: Vec<(Choice, Choice)>,
    /// A: Delete, B: Retain.
    pub reclaim_policy: Option<Choice>,
    /// Mount options, verbatim.
    pub mount_options: Option<Vec<String>>,
}

/// Who may use provisionOnNode.
#[derive(Arbitrary, Clone, Debug)]
pub enum PolicyGen {
    /// Everyone.
    Allow,
    /// Nobody.
    Deny,
    /// These namespaces.
    Namespaces(Vec<NameGen>),
}

/// The placement annotations a claim starts with (the free annotations may then override them).
#[derive(Arbitrary, Clone, Debug)]
pub enum Placement {
    /// None.
    Unplaced,
    /// `kubevirt.io/provisionOnNode` = this node.
    PinnedHere,
    /// `kubevirt.io/provisionOnNode` = another node.
    PinnedElsewhere,
    /// What the PV controller and scheduler write for a WaitForFirstConsumer claim placed here:
    /// storage-provisioner (GA and beta) = ours, selected-node = this node.
    SelectedHere,
    /// The same, selected for another node.
    SelectedElsewhere,
    /// storage-provisioner (GA and beta) = ours, no selected node (an Immediate claim).
    OursUnselected,
}

impl Placement {
    fn annotations(&self) -> Vec<(&'static str, &'static str)> {
        let ours = [(keys::STORAGE_PROVISIONER, PROVISIONER), (keys::STORAGE_PROVISIONER_BETA, PROVISIONER)];
        match self {
            Self::Unplaced => vec![],
            Self::PinnedHere => vec![(keys::PROVISION_ON_NODE, NODE)],
            Self::PinnedElsewhere => vec![(keys::PROVISION_ON_NODE, OTHER_NODE)],
            Self::SelectedHere => [&ours[..], &[(keys::SELECTED_NODE, NODE)]].concat(),
            Self::SelectedElsewhere => [&ours[..], &[(keys::SELECTED_NODE, OTHER_NODE)]].concat(),
            Self::OursUnselected => ours.to_vec(),
        }
    }
}

/// A claim, its class and the decision settings.
#[derive(Arbitrary, Clone, Debug)]
pub struct ClaimInput {
    /// Placement annotations.
    pub placement: Placement,
    /// Further claim annotations (a key given twice keeps the last value).
    pub annotations: Vec<(AnnKey, AnnValue)>,
    /// `metadata.namespace`.
    pub namespace: Option<NameGen>,
    /// `metadata.name`.
    pub name: Option<NameGen>,
    /// `metadata.uid`.
    pub uid: Option<UidGen>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `spec.volumeName` (A: empty, B: a PV name).
    pub volume_name: Option<Choice>,
    /// `spec.storageClassName` (A: hostpath, B: empty).
    pub storage_class_name: Option<Choice>,
    /// `spec.accessModes`.
    pub access_modes: Option<Vec<AccessModeGen>>,
    /// `spec.volumeMode` (A: Filesystem, B: Block).
    pub volume_mode: Option<Choice>,
    /// `spec.selector` is set.
    pub selector: bool,
    /// `spec.dataSource` is set.
    pub data_source: bool,
    /// `spec.dataSourceRef` is set.
    pub data_source_ref: bool,
    /// `spec.resources.requests.storage`.
    pub request: Option<QuantityGen>,
    /// The class, when it exists.
    pub class: Option<ClassInput>,
    /// `USE_NAMING_PREFIX`.
    pub use_naming_prefix: bool,
    /// `PROVISION_ON_NODE`.
    pub policy: PolicyGen,
}

impl ClaimInput {
    /// The claim as the API server would return it.
    pub fn claim(&self) -> PersistentVolumeClaim {
        let spec = PersistentVolumeClaimSpec {
            volume_name: self.volume_name.as_ref().map(|c| c.render("", "pvc-existing")),
            storage_class_name: self.storage_class_name.as_ref().map(|c| c.render("hostpath", "")),
            access_modes: self.access_modes.as_ref().map(|m| m.iter().map(AccessModeGen::render).collect()),
            volume_mode: self.volume_mode.as_ref().map(|c| c.render("Filesystem", "Block")),
            selector: self.selector.then(LabelSelector::default),
            data_source: self.data_source.then(|| TypedLocalObjectReference {
                api_group: None,
                kind: "PersistentVolumeClaim".into(),
                name: "src".into(),
            }),
            data_source_ref: self.data_source_ref.then(|| TypedObjectReference {
                kind: "VolumeSnapshot".into(),
                name: "snap".into(),
                ..Default::default()
            }),
            resources: Some(VolumeResourceRequirements {
                requests: self.request.as_ref().map(|q| BTreeMap::from([("storage".to_owned(), Quantity(q.render()))])),
                ..Default::default()
            }),
            ..Default::default()
        };
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: self.name.as_ref().map(NameGen::render),
                namespace: self.namespace.as_ref().map(NameGen::render),
                uid: self.uid.as_ref().map(UidGen::render),
                annotations: Some(
                    self.placement
                        .annotations()
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .chain(annotations(&self.annotations))
                        .collect(),
                ),
                deletion_timestamp: deletion_timestamp(self.deleting),
                ..Default::default()
            },
            spec: Some(spec),
            status: None,
        }
    }

    /// The class named by the claim, when it exists.
    pub fn class(&self, class_name: &str) -> Option<StorageClass> {
        let c = self.class.as_ref()?;
        Some(StorageClass {
            metadata: ObjectMeta { name: Some(class_name.to_owned()), ..Default::default() },
            provisioner: c.provisioner.render(PROVISIONER, "example.com/other"),
            volume_binding_mode: match (&c.binding_mode, &self.placement) {
                (Some(m), _) => Some(m.render("Immediate", "WaitForFirstConsumer")),
                (None, Placement::SelectedHere | Placement::SelectedElsewhere) => Some("WaitForFirstConsumer".into()),
                (None, _) => None,
            },
            parameters: Some(
                c.parameters
                    .iter()
                    .map(|(k, v)| (k.render("storagePool", "fsType"), v.render("legacy", "fast")))
                    .collect(),
            ),
            reclaim_policy: c.reclaim_policy.as_ref().map(|r| r.render("Delete", "Retain")),
            mount_options: c.mount_options.clone(),
            ..Default::default()
        })
    }

    /// The decision settings.
    pub fn config(&self) -> DecisionConfig {
        DecisionConfig {
            use_naming_prefix: self.use_naming_prefix,
            pools: two_pools(),
            // As config::Args::validate picks it: `legacy` when configured.
            default_pool: Some("legacy".to_owned()),
            pv_finalizer: false,
            provision_on_node: match &self.policy {
                PolicyGen::Allow => ProvisionOnNodePolicy::Allow,
                PolicyGen::Deny => ProvisionOnNodePolicy::Deny,
                PolicyGen::Namespaces(ns) => {
                    ProvisionOnNodePolicy::Namespaces(ns.iter().map(NameGen::render).collect())
                }
            },
            reserved_bytes: 0,
            pv_capacity: PvCapacity::Request,
            affinity_keys: Vec::new(),
            block_device_dir: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Persistent volumes
// ---------------------------------------------------------------------------------------------

/// A PV name.
#[derive(Arbitrary, Clone, Debug)]
pub enum PvNameGen {
    /// `pvc-<uid>`.
    FromUid(UidGen),
    /// Anything.
    Raw(String),
}

/// The last component of a generated path.
#[derive(Arbitrary, Clone, Debug)]
pub enum DirGen {
    /// The PV's name.
    PvName,
    /// `<name>-<pv name>`.
    Prefixed(NameGen),
    /// `<ns>-<name>-<pv name>`.
    Namespaced(NameGen, NameGen),
    /// `pvc-<another uid>`.
    OtherUid(UidGen),
    /// Anything.
    Raw(String),
}

/// One component of a generated path.
#[derive(Arbitrary, Clone, Debug)]
pub enum PathPart {
    /// `var/hpvolumes`.
    PoolRoot,
    /// `mnt/fast-disk`.
    FastRoot,
    /// `var`.
    Var,
    /// `.`.
    Dot,
    /// `..`.
    DotDot,
    /// An empty component (`//`).
    Empty,
    /// A volume directory name.
    Dir(DirGen),
    /// Anything.
    Raw(String),
}

/// A `hostPath.path`.
#[derive(Arbitrary, Clone, Debug)]
pub enum PathGen {
    /// Components joined with '/', absolute or not, maybe with a trailing slash.
    Parts {
        /// Leading '/'.
        absolute: bool,
        /// The components.
        parts: Vec<PathPart>,
        /// Trailing '/'.
        trailing_slash: bool,
    },
    /// Anything.
    Raw(String),
}

impl PathGen {
    /// The path text for a PV named `pv`.
    pub fn render(&self, pv: &str) -> String {
        match self {
            Self::Raw(s) => s.clone(),
            Self::Parts { absolute, parts, trailing_slash } => {
                let rendered: Vec<String> = parts
                    .iter()
                    .map(|p| match p {
                        PathPart::PoolRoot => POOL_ROOT[1..].to_owned(),
                        PathPart::FastRoot => FAST_ROOT[1..].to_owned(),
                        PathPart::Var => "var".into(),
                        PathPart::Dot => ".".into(),
                        PathPart::DotDot => "..".into(),
                        PathPart::Empty => String::new(),
                        PathPart::Dir(DirGen::PvName) => pv.to_owned(),
                        PathPart::Dir(DirGen::Prefixed(n)) => format!("{}-{pv}", n.render()),
                        PathPart::Dir(DirGen::Namespaced(ns, n)) => format!("{}-{}-{pv}", ns.render(), n.render()),
                        PathPart::Dir(DirGen::OtherUid(u)) => layout::pv_name(&u.render()),
                        PathPart::Dir(DirGen::Raw(s)) | PathPart::Raw(s) => s.clone(),
                    })
                    .collect();
                let mut out = if *absolute { "/".to_owned() } else { String::new() };
                out.push_str(&rendered.join("/"));
                if *trailing_slash {
                    out.push('/');
                }
                out
            }
        }
    }
}

/// One node selector requirement.
#[derive(Arbitrary, Clone, Debug)]
pub struct ExprInput {
    /// A: kubernetes.io/hostname, B: topology.kubernetes.io/zone.
    pub key: Choice,
    /// A: In, B: NotIn.
    pub operator: Choice,
    /// Values.
    pub values: Option<Vec<AnnValue>>,
}

/// One node selector term.
#[derive(Arbitrary, Clone, Debug)]
pub struct TermInput {
    /// matchExpressions.
    pub expressions: Option<Vec<ExprInput>>,
    /// matchFields (same shape).
    pub fields: Option<Vec<ExprInput>>,
}

/// A PersistentVolume.
#[derive(Arbitrary, Clone, Debug)]
pub struct VolumeInput {
    /// `metadata.name`.
    pub name: Option<PvNameGen>,
    /// Annotations.
    pub annotations: Option<Vec<(AnnKey, AnnValue)>>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// A: Released, B: Bound.
    pub phase: Option<Choice>,
    /// A: Delete, B: Retain.
    pub reclaim_policy: Option<Choice>,
    /// `spec.hostPath.path`.
    pub host_path: Option<PathGen>,
    /// `spec.nodeAffinity.required.nodeSelectorTerms`.
    pub affinity: Option<Vec<TermInput>>,
    /// Whether `spec` is present at all.
    pub no_spec: bool,
}

fn requirement(e: &ExprInput) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: e.key.render(keys::HOSTNAME_LABEL, "topology.kubernetes.io/zone"),
        operator: e.operator.render("In", "NotIn"),
        values: e.values.as_ref().map(|v| v.iter().map(AnnValue::render).collect()),
    }
}

impl VolumeInput {
    /// The PV's name.
    pub fn pv_name(&self) -> Option<String> {
        self.name.as_ref().map(|n| match n {
            PvNameGen::FromUid(u) => layout::pv_name(&u.render()),
            PvNameGen::Raw(s) => s.clone(),
        })
    }

    /// The PV as the API server would return it, as a node keeps it.
    pub fn pv(&self) -> KeptVolume {
        let name = self.pv_name();
        let spec = PersistentVolumeSpec {
            persistent_volume_reclaim_policy: self.reclaim_policy.as_ref().map(|r| r.render("Delete", "Retain")),
            host_path: self
                .host_path
                .as_ref()
                .map(|p| HostPathVolumeSource { path: p.render(name.as_deref().unwrap_or_default()), type_: None }),
            node_affinity: self.affinity.as_ref().map(|terms| VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: terms
                        .iter()
                        .map(|t| NodeSelectorTerm {
                            match_expressions: t.expressions.as_ref().map(|e| e.iter().map(requirement).collect()),
                            match_fields: t.fields.as_ref().map(|e| e.iter().map(requirement).collect()),
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        };
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name,
                annotations: self.annotations.as_ref().map(|a| annotations(a)),
                deletion_timestamp: deletion_timestamp(self.deleting),
                ..Default::default()
            },
            spec: (!self.no_spec).then_some(spec),
            status: self
                .phase
                .as_ref()
                .map(|p| PersistentVolumeStatus { phase: Some(p.render("Released", "Bound")), ..Default::default() }),
        };
        pv.into()
    }
}

/// The reference model's owner rule (docs/architecture.md, compatibility contract item 6): the provisionOnNode annotation, else
/// a single `kubernetes.io/hostname In [value]` affinity naming this node or its hostname label.
pub fn model_owned_here(pv: &KeptVolume) -> bool {
    if let Some(node) = pv.metadata.annotations.as_ref().and_then(|a| a.get(keys::PROVISION_ON_NODE)) {
        return node == NODE;
    }
    let Some(terms) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| &r.node_selector_terms)
    else {
        return false;
    };
    if terms.len() != 1 {
        return false;
    }
    let Some(exprs) = terms[0].match_expressions.as_ref() else { return false };
    if exprs.len() != 1 || &*exprs[0].key != keys::HOSTNAME_LABEL || &*exprs[0].operator != "In" {
        return false;
    }
    match exprs[0].values.as_deref() {
        Some([value]) => &**value == NODE || &**value == HOSTNAME,
        _ => false,
    }
}
